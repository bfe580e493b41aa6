package sqlstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/outboxkit/outbox"
)

// staged takes the envelopes staged on ctx's scope, adds extra, and checks them.
func (s *Store) staged(ctx context.Context, extra []*outbox.Envelope) ([]*outbox.Envelope, error) {
	var envs []*outbox.Envelope
	if scope := outbox.ScopeFrom(ctx); scope != nil {
		envs = scope.Take()
	}
	envs = append(envs, extra...)
	if err := s.check(envs); err != nil {
		return nil, err
	}
	return envs, nil
}

func (s *Store) writeTx(ctx context.Context, q querier, extra []*outbox.Envelope) ([]*outbox.Envelope, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	envs, err := s.staged(ctx, extra)
	if err != nil || len(envs) == 0 {
		return envs, err
	}
	if err := s.insert(ctx, q, envs); err != nil {
		return nil, s.wrap(ctx, "enqueue in transaction", duplicate(err))
	}
	return envs, nil
}

// withScope returns ctx with a scope: ctx's own, or a new one released by the
// returned func, so sends made inside a unit of work always have somewhere to stage.
func withScope(ctx context.Context) (context.Context, func()) {
	if outbox.ScopeFrom(ctx) != nil {
		return ctx, func() {}
	}
	ctx, scope := outbox.NewScope(ctx)
	return ctx, func() { scope.Release() }
}

// discardStaged empties ctx's scope after a failed unit of work: those envelopes
// rolled back with it, and the scope's release should stay quiet.
func discardStaged(ctx context.Context) {
	if scope := outbox.ScopeFrom(ctx); scope != nil {
		scope.Take()
	}
}

// TransactPgx runs fn in a pgx transaction on the store's pool and, if fn returns
// nil, writes every envelope staged on the context's [outbox.Scope] in that
// transaction with one statement, commits, and wakes the local dispatcher. If fn or
// the write fails, the transaction rolls back and nothing is written; fn's error is
// returned as is.
//
// The INSERT and the COMMIT travel to the server together in one pipelined round
// trip, so the outbox adds no round trip to the application's transaction. fn must
// not commit or roll back tx itself.
func (s *Store) TransactPgx(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if s.pool == nil {
		return fmt.Errorf("%w: sqlstore: TransactPgx needs a store built with NewPgx; use Transact or TransactGorm", outbox.ErrMisconfigured)
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	ctx, release := withScope(ctx)
	defer release()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return s.wrap(ctx, "acquire", err)
	}
	// A connection left inside a transaction is destroyed by the pool on release.
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return s.wrap(ctx, "begin", err)
	}
	finished := false
	defer func() {
		if !finished {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := fn(ctx, tx); err != nil {
		discardStaged(ctx)
		return err
	}
	envs, err := s.staged(ctx, nil)
	if err != nil {
		return err
	}
	if len(envs) == 0 || len(envs) > maxRows(s.dialect) {
		if err := s.insert(ctx, pgxQuerier{tx}, envs); err != nil {
			return s.wrap(ctx, "enqueue in transaction", duplicate(err))
		}
		if err := tx.Commit(ctx); err != nil {
			finished = true
			return s.wrap(ctx, "commit", err)
		}
		finished = true
		s.NotifyCommitted(envs...)
		return nil
	}
	query, args := s.insertStatement(envs)
	batch := &pgx.Batch{}
	batch.Queue(query, args...)
	batch.Queue("COMMIT")
	br := tx.SendBatch(ctx, batch)
	rs, err := br.Query()
	if err == nil {
		err = assignSeqs(rs, envs)
	}
	if err != nil {
		_ = br.Close()
		return s.wrap(ctx, "enqueue in transaction", duplicate(err))
	}
	_, commitErr := br.Exec()
	closeErr := br.Close()
	if commitErr != nil {
		return s.wrap(ctx, "commit", commitErr)
	}
	// The COMMIT ran: the transaction is over whatever Close reports.
	finished = true
	if closeErr != nil {
		return s.wrap(ctx, "commit", closeErr)
	}
	s.NotifyCommitted(envs...)
	return nil
}

// EnqueuePgxTx writes every envelope staged on ctx's scope, and extra, into a pgx
// transaction the application manages, with one statement. It returns what it wrote;
// after committing, pass them to [Store.NotifyCommitted] to wake the local
// dispatcher without waiting for its poll.
func (s *Store) EnqueuePgxTx(ctx context.Context, tx pgx.Tx, extra ...*outbox.Envelope) ([]*outbox.Envelope, error) {
	if s.dialect != PostgreSQL {
		return nil, fmt.Errorf("%w: sqlstore: EnqueuePgxTx on a %v store", outbox.ErrMisconfigured, s.dialect)
	}
	return s.writeTx(ctx, pgxQuerier{tx}, extra)
}

// Transact runs fn in a database/sql transaction (opts may be nil) and, if fn
// returns nil, writes every envelope staged on the context's [outbox.Scope] in that
// transaction with one statement, commits, and wakes the local dispatcher. If fn or
// the write fails, the transaction rolls back and nothing is written; fn's error is
// returned as is.
func (s *Store) Transact(ctx context.Context, opts *sql.TxOptions, fn func(ctx context.Context, tx *sql.Tx) error) error {
	if s.sqlDB == nil {
		return fmt.Errorf("%w: sqlstore: Transact needs a store built with NewDB or NewGorm; use TransactPgx", outbox.ErrMisconfigured)
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	ctx, release := withScope(ctx)
	defer release()
	tx, err := s.sqlDB.BeginTx(ctx, opts)
	if err != nil {
		return s.wrap(ctx, "begin", err)
	}
	committed := false
	defer func() {
		if !committed {
			_ = tx.Rollback()
		}
	}()
	if err := fn(ctx, tx); err != nil {
		discardStaged(ctx)
		return err
	}
	envs, err := s.writeTx(ctx, sqlQuerier{tx}, nil)
	if err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		committed = true // a failed commit has ended the transaction already
		return s.wrap(ctx, "commit", err)
	}
	committed = true
	s.NotifyCommitted(envs...)
	return nil
}

// EnqueueTx writes every envelope staged on ctx's scope, and extra, into a
// database/sql transaction the application manages, with one statement. It returns
// what it wrote; after committing, pass them to [Store.NotifyCommitted].
func (s *Store) EnqueueTx(ctx context.Context, tx *sql.Tx, extra ...*outbox.Envelope) ([]*outbox.Envelope, error) {
	return s.writeTx(ctx, sqlQuerier{tx}, extra)
}

// TransactGorm is the outbox's db.Transaction: it runs fc in a gorm transaction
// (bound to ctx) and, if fc returns nil, writes every envelope staged on ctx's
// [outbox.Scope] in that transaction with one statement, commits, and wakes the
// local dispatcher. If fc or the write fails, everything rolls back and fc's error
// is returned as is.
func (s *Store) TransactGorm(ctx context.Context, fc func(tx *gorm.DB) error, opts ...*sql.TxOptions) error {
	if s.gormDB == nil {
		return fmt.Errorf("%w: sqlstore: TransactGorm needs a store built with NewGorm", outbox.ErrMisconfigured)
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	ctx, release := withScope(ctx)
	defer release()
	var envs []*outbox.Envelope
	err := s.gormDB.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := fc(tx); err != nil {
			return err
		}
		var err error
		envs, err = s.writeTx(ctx, sqlQuerier{tx.Statement.ConnPool}, nil)
		return err
	}, opts...)
	if err != nil {
		discardStaged(ctx)
		return err
	}
	s.NotifyCommitted(envs...)
	return nil
}

// EnqueueGormTx writes every envelope staged on ctx's scope, and extra, into a gorm
// transaction the application manages (the tx of db.Transaction or db.Begin), with
// one statement. It returns what it wrote; after committing, pass them to
// [Store.NotifyCommitted].
func (s *Store) EnqueueGormTx(ctx context.Context, tx *gorm.DB, extra ...*outbox.Envelope) ([]*outbox.Envelope, error) {
	if tx == nil || tx.Statement == nil || tx.Statement.ConnPool == nil {
		return nil, fmt.Errorf("%w: sqlstore: EnqueueGormTx needs a gorm transaction", outbox.ErrMisconfigured)
	}
	if _, ok := tx.Statement.ConnPool.(gorm.TxCommitter); !ok {
		return nil, fmt.Errorf("%w: sqlstore: EnqueueGormTx needs a transaction (db.Begin or the tx of db.Transaction), not a *gorm.DB outside one", outbox.ErrMisconfigured)
	}
	return s.writeTx(ctx, sqlQuerier{tx.Statement.ConnPool}, extra)
}
