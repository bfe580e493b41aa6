package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
)

// Transact runs fn as a unit of work (see [outbox.Transactor]) in a transaction of
// the client the store was built with: a pgx transaction ([NewPgx]) or a *sql.Tx
// ([NewDB], or begun by the [Beginner] of [NewORM]). Inside fn, [PgxTx], [Tx] and
// [TxHandle] reach that transaction from fn's ctx, and every send made with fn's
// ctx, whatever the sender's [outbox.WriteMode], is staged on the unit.
//
// When fn returns nil, Transact writes every staged envelope in the transaction with
// one multi-row INSERT, commits, and wakes the dispatchers (as [Store.NotifyCommitted]
// does). On pgx the INSERT and the COMMIT travel to the server together in one
// pipelined round trip, so the outbox adds no round trip to the transaction. When fn
// returns an error or panics, the transaction rolls back and nothing is written: fn's
// error is returned as is, the panic goes on. When the write or the commit fails,
// everything rolls back and the error is returned.
//
// A Transact on a ctx already inside a unit of work of this store joins it: fn runs
// in the open transaction and its sends commit or roll back with the outer unit. The
// transaction begins with the options [WithTxOptions] put on ctx, if any.
//
// fn must not commit or roll back the transaction itself: return nil to commit, an
// error to roll back. The pgx.Tx that [PgxTx] returns refuses Commit and Rollback.
func (s *Store) Transact(ctx context.Context, fn func(ctx context.Context) error) error {
	if opts := txOptionsFrom(ctx); opts != nil {
		if u, ok := ctx.Value(unitKey{s}).(*unit); ok && !u.ended.Load() {
			return fmt.Errorf("%w: sqlstore: Transact with WithTxOptions inside an open unit of work of the store: the nested Transact joins the transaction, which has begun already; put the options on the ctx of the outermost Transact", outbox.ErrMisconfigured)
		}
	}
	return outbox.RunTransaction(ctx, s, s.beginUnit, func(ctx context.Context) error {
		// A joined fn may run with another store's unit in between: the accessors
		// must reach this store's transaction, not the innermost one.
		if u, ok := ctx.Value(unitKey{s}).(*unit); ok {
			ctx = context.WithValue(ctx, currentUnitKey{}, u)
		}
		return fn(ctx)
	})
}

// unit is one unit of work of a Store: its transaction, on one of the clients.
type unit struct {
	s *Store
	// ended is set as soon as the unit starts to commit or roll back: the accessors
	// then stop handing out the transaction (its pgx connection goes back to the pool).
	ended atomic.Bool

	pgxConn *pgxpool.Conn // pgx: the connection, released when the unit ends
	pgxTx   pgx.Tx
	sqlTx   *sql.Tx // database/sql
	handle  any     // NewORM: the Beginner's handle of sqlTx
}

// unitKey finds a store's unit on a ctx; currentUnitKey the unit of the innermost
// Transact of any Store, for the accessors.
type (
	unitKey        struct{ s *Store }
	currentUnitKey struct{}
	txOptionsKey   struct{}
)

// beginUnit starts the store's transaction for [outbox.RunTransaction].
func (s *Store) beginUnit(ctx context.Context) (context.Context, outbox.Tx, error) {
	if err := s.begin(ctx); err != nil {
		return ctx, nil, err
	}
	opts := txOptionsFrom(ctx)
	u := &unit{s: s}
	switch {
	case s.pool != nil:
		pgxOpts, err := pgxTxOptions(opts)
		if err != nil {
			return ctx, nil, err
		}
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return ctx, nil, s.wrap(ctx, "acquire", err)
		}
		// The COMMIT is pipelined with the INSERT rather than sent by tx.Commit, so
		// the unit holds the connection itself and releases it when it ends (the pool
		// destroys a connection released inside a transaction).
		tx, err := conn.BeginTx(ctx, pgxOpts)
		if err != nil {
			conn.Release()
			return ctx, nil, s.wrap(ctx, "begin", err)
		}
		u.pgxConn, u.pgxTx = conn, tx
	case s.beginner != nil:
		tx, handle, err := s.beginner.BeginTx(ctx, opts)
		if err != nil {
			return ctx, nil, s.wrap(ctx, "begin", err)
		}
		if tx == nil {
			return ctx, nil, fmt.Errorf("%w: sqlstore: the Beginner given to NewORM returned no *sql.Tx and no error", outbox.ErrMisconfigured)
		}
		u.sqlTx, u.handle = tx, handle
	default:
		tx, err := s.sqlDB.BeginTx(ctx, opts)
		if err != nil {
			return ctx, nil, s.wrap(ctx, "begin", err)
		}
		u.sqlTx = tx
	}
	ctx = context.WithValue(ctx, unitKey{s}, u)
	if opts != nil {
		// The options were for this transaction; units begun further in (on another
		// store) take their own.
		ctx = context.WithValue(ctx, txOptionsKey{}, (*sql.TxOptions)(nil))
	}
	return ctx, u, nil
}

// Commit writes envs in the transaction with one statement and commits.
func (u *unit) Commit(ctx context.Context, envs []*outbox.Envelope) error {
	u.ended.Store(true)
	s := u.s
	err := s.checkOpen()
	if err == nil {
		err = s.check(envs)
	}
	if err != nil {
		u.rollback(ctx)
		return err
	}
	if u.pgxTx != nil {
		err = u.commitPgx(ctx, envs)
	} else {
		err = u.commitSQL(ctx, envs)
	}
	if err != nil {
		return err
	}
	s.NotifyCommitted(envs...)
	return nil
}

// Rollback abandons the transaction.
func (u *unit) Rollback(ctx context.Context) {
	u.ended.Store(true)
	u.rollback(ctx)
}

func (u *unit) rollback(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	switch {
	case u.pgxTx != nil:
		_ = u.pgxTx.Rollback(ctx)
		u.pgxConn.Release()
	default:
		_ = u.sqlTx.Rollback()
	}
}

// commitPgx pipelines the multi-row INSERT and the COMMIT: both reach the server in
// one round trip. A unit with nothing to write, or more rows than one statement
// takes, commits the ordinary way.
func (u *unit) commitPgx(ctx context.Context, envs []*outbox.Envelope) error {
	s, tx := u.s, u.pgxTx
	defer u.pgxConn.Release()
	if len(envs) == 0 || len(envs) > maxRows(s.dialect) {
		if err := s.insert(ctx, pgxQuerier{tx}, envs); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return s.wrap(ctx, "enqueue in transaction", duplicate(err))
		}
		return s.wrap(ctx, "commit", tx.Commit(ctx))
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
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return s.wrap(ctx, "enqueue in transaction", duplicate(err))
	}
	tag, commitErr := br.Exec()
	if commitErr == nil && tag.String() == "ROLLBACK" {
		commitErr = pgx.ErrTxCommitRollback
	}
	closeErr := br.Close()
	if commitErr != nil {
		// A failed COMMIT has ended the transaction; the ROLLBACK is for a server
		// that left it open, and harmless otherwise.
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return s.wrap(ctx, "commit", commitErr)
	}
	// The COMMIT ran: the transaction is over whatever Close reports.
	return s.wrap(ctx, "commit", closeErr)
}

// commitSQL writes envs with one statement on the database/sql transaction and
// commits it.
func (u *unit) commitSQL(ctx context.Context, envs []*outbox.Envelope) error {
	s := u.s
	if err := s.insert(ctx, sqlQuerier{u.sqlTx}, envs); err != nil {
		u.rollback(ctx)
		return s.wrap(ctx, "enqueue in transaction", duplicate(err))
	}
	return s.wrap(ctx, "commit", u.sqlTx.Commit())
}

// current returns the open unit of work on ctx, or nil.
func current(ctx context.Context) *unit {
	u, ok := ctx.Value(currentUnitKey{}).(*unit)
	if !ok || u.ended.Load() {
		return nil
	}
	return u
}

// PgxTx returns the pgx transaction of the unit of work on ctx: call it with the ctx
// that [Store.Transact] passes to its function, on a store built with [NewPgx].
// Statements run on it commit or roll back with the unit's messages. ok is false
// outside a unit of work, on a store built on another client, and once the unit has
// ended.
//
// The transaction belongs to the unit: its Commit and Rollback return an error
// wrapping [outbox.ErrMisconfigured] (return nil or an error from the function
// instead). Savepoints (its Begin) work as usual.
func PgxTx(ctx context.Context) (tx pgx.Tx, ok bool) {
	u := current(ctx)
	if u == nil || u.pgxTx == nil {
		return nil, false
	}
	return unitPgxTx{u.pgxTx}, true
}

// Tx returns the database/sql transaction of the unit of work on ctx: call it with
// the ctx that [Store.Transact] passes to its function, on a store built with
// [NewDB] or [NewORM] (a gorm store too). ok is false outside a unit of work, on a
// store built on another client, and once the unit has ended.
//
// Do not call its Commit or Rollback: return nil or an error from the function.
func Tx(ctx context.Context) (tx *sql.Tx, ok bool) {
	u := current(ctx)
	if u == nil || u.sqlTx == nil {
		return nil, false
	}
	return u.sqlTx, true
}

// TxHandle returns the handle that the [Beginner] of a store built with [NewORM]
// returned with the transaction of the unit of work on ctx: the ORM's own object
// for it. An ORM package wraps it in a typed accessor (gormstore.Tx); applications
// call that. ok is false outside a unit of work, on a store built otherwise, when
// the Beginner returned a nil handle, and once the unit has ended.
func TxHandle(ctx context.Context) (handle any, ok bool) {
	u := current(ctx)
	if u == nil || u.handle == nil {
		return nil, false
	}
	return u.handle, true
}

// WithTxOptions returns a ctx whose next unit of work ([Store.Transact] called with
// it, or with a ctx derived from it) begins its transaction with opts: an isolation
// level, read-only. On pgx they map to pgx.TxOptions (LevelSnapshot is
// REPEATABLE READ there; levels PostgreSQL lacks are refused with
// [outbox.ErrMisconfigured]); on database/sql (and an ORM's [Beginner]) the driver
// applies them.
//
// The options are for one transaction: the ctx that Transact passes to its function
// no longer carries them. A Transact that would join an open unit of work of the same
// store fails with [outbox.ErrMisconfigured] when its ctx carries options, since that
// transaction has begun already.
func WithTxOptions(ctx context.Context, opts sql.TxOptions) context.Context {
	return context.WithValue(ctx, txOptionsKey{}, &opts)
}

func txOptionsFrom(ctx context.Context) *sql.TxOptions {
	opts, _ := ctx.Value(txOptionsKey{}).(*sql.TxOptions)
	return opts
}

// pgxTxOptions maps database/sql transaction options to pgx's, as pgx's stdlib
// driver does.
func pgxTxOptions(opts *sql.TxOptions) (pgx.TxOptions, error) {
	var o pgx.TxOptions
	if opts == nil {
		return o, nil
	}
	switch opts.Isolation {
	case sql.LevelDefault:
	case sql.LevelReadUncommitted:
		o.IsoLevel = pgx.ReadUncommitted
	case sql.LevelReadCommitted:
		o.IsoLevel = pgx.ReadCommitted
	case sql.LevelRepeatableRead, sql.LevelSnapshot:
		o.IsoLevel = pgx.RepeatableRead
	case sql.LevelSerializable:
		o.IsoLevel = pgx.Serializable
	default:
		return o, fmt.Errorf("%w: sqlstore: WithTxOptions: PostgreSQL has no isolation level %v; use LevelReadCommitted, LevelRepeatableRead or LevelSerializable", outbox.ErrMisconfigured, opts.Isolation)
	}
	if opts.ReadOnly {
		o.AccessMode = pgx.ReadOnly
	}
	return o, nil
}

// unitPgxTx is the unit's pgx transaction as the application sees it: the unit
// commits and rolls back, the application does not.
type unitPgxTx struct{ pgx.Tx }

func (unitPgxTx) Commit(context.Context) error { return errUnitOwnsTx }

func (unitPgxTx) Rollback(context.Context) error { return errUnitOwnsTx }

var errUnitOwnsTx = fmt.Errorf("%w: sqlstore: the unit of work commits and rolls back its transaction: return nil from the function given to Transact to commit, an error to roll back", outbox.ErrMisconfigured)

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

// EnqueuePgxTx writes the envelopes staged on ctx's [outbox.Scope] (see
// [outbox.NewScope]), and extra, into a pgx transaction the application manages,
// with one statement. It returns what it wrote; after committing, pass them to
// [Store.NotifyCommitted] to wake the dispatchers without waiting for their poll.
// Every envelope is checked before any SQL runs; a refused call writes nothing.
//
// Inside [Store.Transact] no call is needed: the unit of work writes its sends.
func (s *Store) EnqueuePgxTx(ctx context.Context, tx pgx.Tx, extra ...*outbox.Envelope) ([]*outbox.Envelope, error) {
	if s.dialect != PostgreSQL {
		return nil, fmt.Errorf("%w: sqlstore: EnqueuePgxTx on a %v store; use EnqueueTx", outbox.ErrMisconfigured, s.dialect)
	}
	if tx == nil {
		return nil, fmt.Errorf("%w: sqlstore: EnqueuePgxTx needs a pgx transaction", outbox.ErrMisconfigured)
	}
	return s.writeTx(ctx, pgxQuerier{tx}, extra)
}

// EnqueueTx writes the envelopes staged on ctx's [outbox.Scope] (see
// [outbox.NewScope]), and extra, into a database/sql transaction the application
// manages, with one statement. It returns what it wrote; after committing, pass them
// to [Store.NotifyCommitted]. Every envelope is checked before any SQL runs; a
// refused call writes nothing.
func (s *Store) EnqueueTx(ctx context.Context, tx *sql.Tx, extra ...*outbox.Envelope) ([]*outbox.Envelope, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: sqlstore: EnqueueTx needs a *sql.Tx", outbox.ErrMisconfigured)
	}
	return s.writeTx(ctx, sqlQuerier{tx}, extra)
}
