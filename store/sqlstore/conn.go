package sqlstore

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// querier is what every statement runs on: a pool, a *sql.DB, or a transaction of
// either kind. It keeps the SQL in one place whatever client the caller passed in.
type querier interface {
	exec(ctx context.Context, query string, args ...any) (int64, error)
	query(ctx context.Context, query string, args ...any) (rows, error)
}

// rows is the part of *sql.Rows and pgx.Rows the store reads.
type rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// sqlConn is satisfied by *sql.DB, *sql.Tx and *sql.Conn.
type sqlConn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

type sqlQuerier struct{ c sqlConn }

func (q sqlQuerier) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.c.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (q sqlQuerier) query(ctx context.Context, query string, args ...any) (rows, error) {
	r, err := q.c.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{r}, nil
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// pgxConn is satisfied by *pgxpool.Pool, *pgx.Conn and pgx.Tx.
type pgxConn interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

type pgxQuerier struct{ c pgxConn }

func (q pgxQuerier) exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := q.c.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (q pgxQuerier) query(ctx context.Context, query string, args ...any) (rows, error) {
	r, err := q.c.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return r, nil
}
