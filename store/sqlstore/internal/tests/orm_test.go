package tests

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/internal/orm"
)

// ormBeginner stands for an ORM package: it begins the units' transactions on a
// *sql.DB and hands out its own object for each.
type ormBeginner struct {
	db    *sql.DB
	fail  error // BeginTx fails with it
	nilTx bool  // BeginTx returns neither a transaction nor an error
	begun int
}

// ormTx is the ORM's object for a unit's transaction.
type ormTx struct {
	tx   *sql.Tx
	opts *sql.TxOptions
}

func (o *ormBeginner) BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, any, error) {
	switch {
	case o.fail != nil:
		return nil, nil, o.fail
	case o.nilTx:
		return nil, nil, nil
	}
	tx, err := o.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	o.begun++
	return tx, &ormTx{tx: tx, opts: opts}, nil
}

// As hands out the ORM itself, as gormstore's hands out the *gorm.DB.
func (o *ormBeginner) As(target any) bool {
	if t, ok := target.(**ormBeginner); ok {
		*t = o
		return true
	}
	return false
}

// TestNewORMBeginsThroughTheBeginner: a store built with NewORM begins each unit
// through its Beginner, writes and commits the messages in the *sql.Tx it returned,
// and hands the Beginner's handle out through the ORM packages' handle accessor; Store.As reaches the
// Beginner's As.
func TestNewORMBeginsThroughTheBeginner(t *testing.T) {
	ctx := testContext(t)
	db := sqliteDB(t)
	_, err := sqlstore.NewORM(db, sqlstore.SQLite, nil, sqlstore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "NewDB", "without a Beginner, NewDB is the constructor")
	_, err = sqlstore.NewORM(nil, sqlstore.SQLite, &ormBeginner{}, sqlstore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = sqlstore.NewORM(db, sqlstore.SQLite, &ormBeginner{db: db}, sqlstore.Config{Table: "bad-name"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "the config is validated as by NewDB")

	beginner := &ormBeginner{db: db}
	s, err := sqlstore.NewORM(db, sqlstore.SQLite, beginner, withTable(sqlstore.Config{}))
	s = migrated(t, s, err)
	var gotORM *ormBeginner
	require.True(t, s.As(&gotORM), "As reaches the Beginner's As")
	require.Same(t, beginner, gotORM)
	var gotDB *sql.DB
	require.True(t, s.As(&gotDB))
	require.Same(t, db, gotDB)
	require.False(t, s.As(new(int)))

	orders := businessTable(t, s)
	sender := capture(t, s, outbox.Transactional)
	insert := func(ctx context.Context, id int) error {
		h, ok := orm.TxHandle(ctx)
		require.True(t, ok, "orm.TxHandle finds the Beginner's handle")
		tx, ok := sqlstore.SQLTx(ctx)
		require.True(t, ok, "SQLTx finds the *sql.Tx the Beginner returned")
		require.Same(t, h.(*ormTx).tx, tx)
		if _, err := h.(*ormTx).tx.ExecContext(ctx, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", id, "x"); err != nil {
			return err
		}
		return sender.Send(ctx, orderMsg(id))
	}

	boom := errors.New("declined")
	err = s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, insert(ctx, 1))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, countRows(t, s, orders), "the unit rolled back the Beginner's transaction")
	require.Zero(t, countRows(t, s, s.Config().Table))

	var leaked context.Context
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		leaked = ctx
		h, _ := orm.TxHandle(ctx)
		require.Nil(t, h.(*ormTx).opts, "no options on ctx: nil")
		return insert(ctx, 2)
	}))
	require.Equal(t, 1, countRows(t, s, orders), "the unit committed the Beginner's transaction")
	require.Equal(t, 1, countRows(t, s, s.Config().Table), "with the message")
	require.Equal(t, 2, beginner.begun)
	_, ok := orm.TxHandle(leaked)
	require.False(t, ok, "no handle once the unit ended")

	readOnly := sqlstore.WithTxOptions(ctx, sql.TxOptions{ReadOnly: true})
	require.NoError(t, s.Transact(readOnly, func(ctx context.Context) error {
		h, _ := orm.TxHandle(ctx)
		require.True(t, h.(*ormTx).opts.ReadOnly, "WithTxOptions reaches the Beginner")
		return nil
	}))

	beginner.fail = errors.New("no connection")
	ran := false
	err = s.Transact(ctx, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, beginner.fail, "a failed begin comes back wrapped")
	require.False(t, ran)

	beginner.fail, beginner.nilTx = nil, true
	err = s.Transact(ctx, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "a Beginner that returns no transaction is refused")
	require.False(t, ran)
}
