package gormstore

import (
	"context"
	"database/sql"
	"fmt"

	"gorm.io/gorm"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/internal/orm"
)

// New returns a store on a *gorm.DB the caller opened with the postgres, mysql or
// sqlite dialector; the dialect follows the dialector's name. cfg is validated as
// by [sqlstore.NewDB]. Inside [sqlstore.Store.Transact], [Tx] (and [sqlstore.SQLTx])
// reach the unit's transaction; a transaction the application manages takes the
// staged messages with [EnqueueTx]. Close the store, not db, to stop its background
// work: the store never closes db.
func New(db *gorm.DB, cfg sqlstore.Config) (*sqlstore.Store, error) {
	if db == nil || db.Config == nil || db.Dialector == nil {
		return nil, fmt.Errorf("%w: gormstore: New needs a *gorm.DB opened with gorm.Open", outbox.ErrMisconfigured)
	}
	var dialect sqlstore.Dialect
	switch name := db.Dialector.Name(); name {
	case "postgres":
		dialect = sqlstore.PostgreSQL
	case "mysql":
		dialect = sqlstore.MySQL
	case "sqlite":
		dialect = sqlstore.SQLite
	default:
		return nil, fmt.Errorf("%w: gormstore: gorm dialector %q is not supported: open gorm with the postgres, mysql or sqlite dialector", outbox.ErrMisconfigured, name)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("%w: gormstore: gorm has no *sql.DB (db.DB() failed): %w", outbox.ErrMisconfigured, err)
	}
	return sqlstore.NewORM(sqlDB, dialect, beginner{db}, cfg)
}

// beginner begins the store's units of work through gorm.
type beginner struct{ db *gorm.DB }

// unitTx is the handle of a unit's gorm transaction, as the store keeps it for [Tx].
type unitTx struct{ tx *gorm.DB }

// BeginTx implements [sqlstore.Beginner].
func (b beginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, any, error) {
	var gopts []*sql.TxOptions
	if opts != nil {
		gopts = append(gopts, opts)
	}
	tx := b.db.WithContext(ctx).Begin(gopts...)
	if tx.Error != nil {
		return nil, nil, tx.Error
	}
	sqlTx, err := sqlTxOf(tx, "Transact")
	if err != nil {
		tx.Rollback()
		return nil, nil, err
	}
	return sqlTx, unitTx{tx}, nil
}

// As hands [sqlstore.Store.As] the *gorm.DB for a **gorm.DB target.
func (b beginner) As(target any) bool {
	if t, ok := target.(**gorm.DB); ok {
		*t = b.db
		return true
	}
	return false
}

// sqlTxOf returns the *sql.Tx under a gorm transaction: its connection pool in
// gorm's default mode, the transaction of gorm's prepared-statement wrapper in
// PrepareStmt mode.
func sqlTxOf(tx *gorm.DB, call string) (*sql.Tx, error) {
	switch pool := tx.Statement.ConnPool.(type) {
	case *sql.Tx:
		return pool, nil
	case *gorm.PreparedStmtTX:
		if sqlTx, ok := pool.Tx.(*sql.Tx); ok && sqlTx != nil {
			return sqlTx, nil
		}
		return nil, fmt.Errorf("%w: gormstore: %s: gorm's prepared-statement transaction wraps a %T, not a *sql.Tx: open gorm on a connection pool whose transactions are *sql.Tx (gorm's default)", outbox.ErrMisconfigured, call, pool.Tx)
	}
	return nil, fmt.Errorf("%w: gormstore: %s: gorm's transaction is a %T, not a *sql.Tx: open gorm on a connection pool whose transactions are *sql.Tx (gorm's default, with or without PrepareStmt)", outbox.ErrMisconfigured, call, tx.Statement.ConnPool)
}

// Tx returns the gorm transaction of the unit of work on ctx, bound to ctx (so a
// send made from a gorm hook with tx.Statement.Context joins the unit): call it with
// the ctx that [sqlstore.Store.Transact] passes to its function, on a store built
// with [New]. Statements run on it commit or roll back with the unit's messages
// (and, in a nested Transact, with its savepoint). ok is false outside a unit of
// work, when the innermost sqlstore unit on ctx is on a store built otherwise, and
// once the unit has ended.
//
// Do not call its Commit or Rollback: return nil or an error from the function.
// SavePoint and RollbackTo work as usual; a nested Transact is a savepoint too, and
// also drops the nested unit's sends when it fails.
func Tx(ctx context.Context) (tx *gorm.DB, ok bool) {
	h, ok := orm.TxHandle(ctx)
	u, isGorm := h.(unitTx)
	if !ok || !isGorm {
		return nil, false
	}
	return u.tx.WithContext(ctx), true
}

// EnqueueTx writes into a gorm transaction the application manages (the tx of
// db.Transaction, or db.Begin()), for store and with one statement, the messages
// staged on ctx's scope (sends made with the ctx of [outbox.NewScope]) followed by
// msgs; a message with a zero ID gets a UUIDv7. Every message is checked before any
// SQL runs; a refused call writes nothing.
//
// It returns what it wrote; after committing, pass it to
// [sqlstore.Store.NotifyCommitted] to wake the relays without waiting for their
// poll. Inside [sqlstore.Store.Transact] no call is needed: the unit of work writes
// its sends.
func EnqueueTx(ctx context.Context, store *sqlstore.Store, tx *gorm.DB, msgs ...outbox.Message) ([]*driver.Envelope, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: gormstore: EnqueueTx needs the store (from gormstore.New)", outbox.ErrMisconfigured)
	}
	if tx == nil || tx.Statement == nil || tx.Statement.ConnPool == nil {
		return nil, fmt.Errorf("%w: gormstore: EnqueueTx needs a gorm transaction", outbox.ErrMisconfigured)
	}
	if _, ok := tx.Statement.ConnPool.(gorm.TxCommitter); !ok {
		return nil, fmt.Errorf("%w: gormstore: EnqueueTx needs a transaction (db.Begin() or the tx of db.Transaction), not a *gorm.DB outside one", outbox.ErrMisconfigured)
	}
	sqlTx, err := sqlTxOf(tx, "EnqueueTx")
	if err != nil {
		return nil, err
	}
	return store.EnqueueTx(ctx, sqlTx, msgs...)
}
