package sqlstore

import (
	"context"
	"database/sql"
	"strings"
	"sync"
)

// preparedInserts keeps the multi-row INSERTs of the sizes most writes have
// prepared, on MySQL. go-sql-driver/mysql (unless the DSN sets interpolateParams)
// prepares every statement run with arguments: a round trip before the one that
// runs it, on every write. A statement prepared on the *sql.DB is prepared once per
// connection and then reused by every transaction on that connection, so a
// one-message write costs one round trip instead of two.
type preparedInserts struct {
	mu    sync.Mutex
	stmts map[string]*sql.Stmt // by query text
}

// maxPreparedRows bounds the statements kept: one per row count up to it, for each
// column list.
const maxPreparedRows = 16

// exec runs query with args on c, through the prepared statement when c is a
// transaction of db and the statement is of a size kept.
func (p *preparedInserts) exec(ctx context.Context, db *sql.DB, c sqlConn, query string, rows int, args []any) (sql.Result, error) {
	tx, ok := c.(*sql.Tx)
	if !ok || db == nil || rows > maxPreparedRows {
		return c.ExecContext(ctx, query, args...)
	}
	stmt, err := p.get(ctx, db, query)
	if err != nil {
		return c.ExecContext(ctx, query, args...)
	}
	res, err := tx.StmtContext(ctx, stmt).ExecContext(ctx, args...)
	if err != nil && strings.Contains(err.Error(), "statement from different database") {
		// The application's transaction is on another *sql.DB than the store's.
		return c.ExecContext(ctx, query, args...)
	}
	return res, err
}

func (p *preparedInserts) get(ctx context.Context, db *sql.DB, query string) (*sql.Stmt, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if stmt, ok := p.stmts[query]; ok {
		return stmt, nil
	}
	stmt, err := db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if p.stmts == nil {
		p.stmts = make(map[string]*sql.Stmt)
	}
	p.stmts[query] = stmt
	return stmt, nil
}

// close closes every kept statement; the *sql.DB stays the caller's.
func (p *preparedInserts) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, stmt := range p.stmts {
		_ = stmt.Close()
	}
	p.stmts = nil
}
