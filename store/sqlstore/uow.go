package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore/internal/orm"
)

// Transact runs fn as a unit of work (see [outbox.Transactor]) in a transaction of
// the client the store was built with: a pgx transaction ([NewPgx]) or a *sql.Tx
// ([NewDB], or begun by the [Beginner] of [NewORM]). Inside fn, [PgxTx] and [SQLTx]
// (or an ORM package's accessor, such as gormstore.Tx) reach that transaction from
// fn's ctx, and every send made with fn's ctx, whatever the sender's
// [outbox.WriteMode], is staged on the unit.
//
// When fn returns nil, Transact writes every staged message in the transaction with
// one multi-row INSERT, commits, and wakes the dispatchers (as [Store.NotifyCommitted]
// does). On pgx the INSERT and the COMMIT travel to the server together in one
// pipelined round trip, so the outbox adds no round trip to the transaction. When fn
// returns an error or panics, the transaction rolls back and nothing is written: fn's
// error is returned as is, the panic goes on. When the write or the commit fails,
// everything rolls back and the error is returned.
//
// A Transact on a ctx already inside a unit of work of this store is a savepoint of
// its transaction (SAVEPOINT outbox_sp_N): fn runs in the open transaction; when it
// fails or panics, ROLLBACK TO SAVEPOINT undoes its statements and its sends are
// dropped, and the outer unit goes on; when it succeeds, RELEASE SAVEPOINT keeps
// them and its sends commit or roll back with the outer unit. On PostgreSQL this is
// also how a unit recovers from a failed statement: run it in a nested Transact and
// the transaction is usable again after the nested unit fails.
//
// The transaction begins with the options [WithTxOptions] put on ctx, if any; a
// nested Transact whose ctx carries options fails with [outbox.ErrMisconfigured],
// as its transaction has begun already.
//
// fn must not commit or roll back the transaction itself: return nil to commit, an
// error to roll back. The pgx.Tx that [PgxTx] returns refuses Commit and Rollback.
func (s *Store) Transact(ctx context.Context, fn func(ctx context.Context) error) error {
	opts := txOptionsFrom(ctx)
	if opts != nil && driver.InUnit(ctx, s) {
		return fmt.Errorf("%w: sqlstore: Transact with WithTxOptions inside an open unit of work of the store: the nested Transact is a savepoint of a transaction that has begun already; put the options on the ctx of the outermost Transact", outbox.ErrMisconfigured)
	}
	if opts != nil {
		// The options were for this unit's transaction: units begun further in (on
		// another store) take their own, and nested ones of this store none.
		inner := fn
		fn = func(ctx context.Context) error {
			return inner(context.WithValue(ctx, txOptionsKey{}, (*sql.TxOptions)(nil)))
		}
	}
	return driver.RunTransaction(ctx, driver.Unit{Owner: s, BucketCount: s.cfg.BucketCount, Begin: s.beginUnit}, fn)
}

// unit is one unit of work of a Store: its transaction, on one of the clients.
// [driver.TxFrom] finds it on a unit's ctx for the accessors, until it ends.
type unit struct {
	s *Store

	pgxConn *pgxpool.Conn // pgx: the connection, released when the unit ends
	pgxTx   pgx.Tx
	sqlTx   *sql.Tx // database/sql
	handle  any     // NewORM: the Beginner's handle of sqlTx

	savepoints atomic.Int64 // names the unit's savepoints: outbox_sp_1, outbox_sp_2, ...
}

var _ orm.Unit = (*unit)(nil)

type txOptionsKey struct{}

// beginUnit starts the store's transaction for [driver.RunTransaction].
func (s *Store) beginUnit(ctx context.Context) (driver.Tx, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	opts := txOptionsFrom(ctx)
	u := &unit{s: s}
	switch {
	case s.pool != nil:
		pgxOpts, err := pgxTxOptions(opts)
		if err != nil {
			return nil, err
		}
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return nil, s.wrap(ctx, "acquire", err)
		}
		// The COMMIT is pipelined with the INSERT rather than sent by tx.Commit, so
		// the unit holds the connection itself and releases it when it ends (the pool
		// destroys a connection released inside a transaction).
		tx, err := conn.BeginTx(ctx, pgxOpts)
		if err != nil {
			conn.Release()
			return nil, s.wrap(ctx, "begin", err)
		}
		u.pgxConn, u.pgxTx = conn, tx
	case s.beginner != nil:
		tx, handle, err := s.beginner.BeginTx(ctx, opts)
		if err != nil {
			return nil, s.wrap(ctx, "begin", err)
		}
		if tx == nil {
			return nil, fmt.Errorf("%w: sqlstore: the Beginner given to NewORM returned no *sql.Tx and no error", outbox.ErrMisconfigured)
		}
		u.sqlTx, u.handle = tx, handle
	default:
		tx, err := s.sqlDB.BeginTx(ctx, opts)
		if err != nil {
			return nil, s.wrap(ctx, "begin", err)
		}
		u.sqlTx = tx
	}
	return u, nil
}

// querier runs statements in the unit's transaction.
func (u *unit) querier() querier {
	if u.pgxTx != nil {
		return pgxQuerier{u.pgxTx}
	}
	return sqlQuerier{u.sqlTx}
}

// ORMHandle implements [orm.Unit].
func (u *unit) ORMHandle() any { return u.handle }

// Savepoint implements [driver.Tx]: SAVEPOINT outbox_sp_N in the unit's transaction,
// N counting the unit's savepoints. PostgreSQL, MySQL/MariaDB and SQLite all take
// the statement inside a transaction.
func (u *unit) Savepoint(ctx context.Context) (driver.Savepoint, error) {
	if err := u.s.begin(ctx); err != nil {
		return nil, err
	}
	sp := savepoint{u: u, name: "outbox_sp_" + strconv.FormatInt(u.savepoints.Add(1), 10)}
	if _, err := u.querier().exec(ctx, "SAVEPOINT "+sp.name); err != nil {
		return nil, u.s.wrap(ctx, "savepoint", err)
	}
	return sp, nil
}

// savepoint is a mark in a unit's transaction, for a nested Transact.
type savepoint struct {
	u    *unit
	name string
}

// Release keeps what the nested unit wrote: RELEASE SAVEPOINT.
func (sp savepoint) Release(ctx context.Context) error {
	_, err := sp.u.querier().exec(ctx, "RELEASE SAVEPOINT "+sp.name)
	return sp.u.s.wrap(ctx, "release savepoint", err)
}

// Rollback undoes what the nested unit wrote: ROLLBACK TO SAVEPOINT, which also
// clears a PostgreSQL transaction's failed state.
func (sp savepoint) Rollback(ctx context.Context) error {
	_, err := sp.u.querier().exec(ctx, "ROLLBACK TO SAVEPOINT "+sp.name)
	return sp.u.s.wrap(ctx, "roll back to savepoint", err)
}

// Commit writes envs in the transaction with one statement and commits.
func (u *unit) Commit(ctx context.Context, envs []*driver.Envelope) error {
	s := u.s
	err := s.checkOpen()
	if err == nil {
		err = s.check(envs)
	}
	if err != nil {
		u.rollback(ctx)
		return err
	}
	switch {
	case s.logMode() && u.pgxTx != nil:
		return u.commitLogPgx(ctx, envs)
	case s.logMode():
		return u.commitLogSQL(ctx, envs)
	case u.pgxTx != nil:
		err = u.commitPgx(ctx, envs)
	default:
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
func (u *unit) commitPgx(ctx context.Context, envs []*driver.Envelope) error {
	s, tx := u.s, u.pgxTx
	defer u.pgxConn.Release()
	if len(envs) == 0 || len(envs) > maxRows(s.dialect) {
		if err := s.insert(ctx, pgxQuerier{tx}, envs); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return s.wrap(ctx, "enqueue in transaction", duplicate(err))
		}
		return s.wrap(ctx, "commit", tx.Commit(ctx))
	}
	if err := s.verifyBuckets(ctx, pgxQuerier{tx}); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
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
func (u *unit) commitSQL(ctx context.Context, envs []*driver.Envelope) error {
	s := u.s
	if err := s.insert(ctx, sqlQuerier{u.sqlTx}, envs); err != nil {
		u.rollback(ctx)
		return s.wrap(ctx, "enqueue in transaction", endedInside(duplicate(err), len(envs)))
	}
	return s.wrap(ctx, "commit", endedInside(u.sqlTx.Commit(), len(envs)))
}

// endedInside names the one way a unit's messages can be lost through the front door:
// the function ended the unit's *sql.Tx itself (SQLTx's Commit or Rollback), so what
// it wrote before committed or rolled back without the unit's n messages.
func endedInside(err error, n int) error {
	if !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return fmt.Errorf("%w: sqlstore: the unit's transaction was committed or rolled back inside the function given to Transact (through SQLTx, or an ORM handle on it): the application's statements before that took effect, and the unit's %d message(s) were NOT written; never call Commit or Rollback on SQLTx's transaction, return nil or an error from the function instead: %w",
		outbox.ErrMisconfigured, n, err)
}

// PgxTx returns the pgx transaction of the unit of work on ctx: call it with the ctx
// that [Store.Transact] passes to its function, on a store built with [NewPgx].
// Statements run on it commit or roll back with the unit's messages (and, in a
// nested Transact, with its savepoint). ok is false outside a unit of work, when the
// innermost sqlstore unit on ctx is on another client, and once the unit has ended.
//
// The transaction belongs to the unit: its Commit and Rollback return an error
// wrapping [outbox.ErrMisconfigured] (return nil or an error from the function
// instead). Its Begin (pgx's pseudo-nested transaction, a savepoint) works as usual;
// a nested Transact does the same and also drops the nested unit's sends.
func PgxTx(ctx context.Context) (tx pgx.Tx, ok bool) {
	u, ok := driver.TxFrom[*unit](ctx)
	if !ok || u.pgxTx == nil {
		return nil, false
	}
	return unitPgxTx{u.pgxTx}, true
}

// SQLTx returns the database/sql transaction of the unit of work on ctx: call it
// with the ctx that [Store.Transact] passes to its function, on a store built with
// [NewDB] or [NewORM] (a gorm store too). Statements run on it commit or roll back
// with the unit's messages (and, in a nested Transact, with its savepoint). ok is
// false outside a unit of work, when the innermost sqlstore unit on ctx is on
// another client, and once the unit has ended.
//
// Do not call its Commit or Rollback: return nil or an error from the function.
func SQLTx(ctx context.Context) (tx *sql.Tx, ok bool) {
	u, ok := driver.TxFrom[*unit](ctx)
	if !ok || u.sqlTx == nil {
		return nil, false
	}
	return u.sqlTx, true
}

// WithTxOptions returns a ctx whose next unit of work ([Store.Transact] called with
// it, or with a ctx derived from it) begins its transaction with opts: an isolation
// level, read-only. On pgx they map to pgx.TxOptions (LevelSnapshot is
// REPEATABLE READ there; levels PostgreSQL lacks are refused with
// [outbox.ErrMisconfigured]); on database/sql (and an ORM's [Beginner]) the driver
// applies them.
//
// The options are for one transaction: the ctx that Transact passes to its function
// no longer carries them. A nested Transact (a savepoint of an open unit of work of
// the same store) fails with [outbox.ErrMisconfigured] when its ctx carries options,
// since that transaction has begun already.
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

// staged takes the messages staged on ctx's application scope, adds msgs, and
// checks them all.
func (s *Store) staged(ctx context.Context, msgs []outbox.Message) ([]*driver.Envelope, error) {
	envs, err := driver.Take(ctx, s.cfg.BucketCount)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: %w", err)
	}
	extra, err := s.envelopes(msgs)
	if err != nil {
		return nil, err
	}
	envs = append(envs, extra...)
	if err := s.check(envs); err != nil {
		return nil, err
	}
	return envs, nil
}

func (s *Store) writeTx(ctx context.Context, q querier, msgs []outbox.Message) ([]*driver.Envelope, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	envs, err := s.staged(ctx, msgs)
	if err != nil || len(envs) == 0 {
		return envs, err
	}
	if s.logMode() {
		if err := s.emit(ctx, q, envs); err != nil {
			return nil, s.wrap(ctx, "write into the log in transaction", err)
		}
		return envs, nil
	}
	if err := s.insert(ctx, q, envs); err != nil {
		return nil, s.wrap(ctx, "enqueue in transaction", duplicate(err))
	}
	return envs, nil
}

// EnqueuePgxTx writes into a pgx transaction the application manages, with one
// statement, the messages staged on ctx's scope (sends made with the ctx of
// [outbox.NewScope]) followed by msgs; a message with a zero ID gets a UUIDv7. Every
// message is checked before any SQL runs; a refused call writes nothing (the
// scope's messages are taken all the same: roll the transaction back).
//
// It returns what it wrote, as the relay side's envelopes; after committing the
// transaction, pass them to [Store.NotifyCommitted] to wake the relays without
// waiting for their poll (nothing else needs them). Inside [Store.Transact] no call
// is needed: the unit of work writes its sends.
func (s *Store) EnqueuePgxTx(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) ([]*driver.Envelope, error) {
	if s.dialect != PostgreSQL {
		return nil, fmt.Errorf("%w: sqlstore: EnqueuePgxTx on a %v store; use EnqueueTx", outbox.ErrMisconfigured, s.dialect)
	}
	if tx == nil {
		return nil, fmt.Errorf("%w: sqlstore: EnqueuePgxTx needs a pgx transaction", outbox.ErrMisconfigured)
	}
	return s.writeTx(ctx, pgxQuerier{tx}, msgs)
}

// EnqueueTx writes into a database/sql transaction the application manages, with
// one statement, the messages staged on ctx's scope (sends made with the ctx of
// [outbox.NewScope]) followed by msgs, as [Store.EnqueuePgxTx] does on pgx. After
// committing, pass what it returns to [Store.NotifyCommitted].
func (s *Store) EnqueueTx(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) ([]*driver.Envelope, error) {
	if tx == nil {
		return nil, fmt.Errorf("%w: sqlstore: EnqueueTx needs a *sql.Tx", outbox.ErrMisconfigured)
	}
	return s.writeTx(ctx, sqlQuerier{tx}, msgs)
}
