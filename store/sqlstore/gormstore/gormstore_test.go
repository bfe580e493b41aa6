package gormstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/gormstore"
)

// TestNewTakesTheDialectFromTheDialector: each dialector gives its dialect, and the
// store's clients are the *gorm.DB and gorm's *sql.DB.
func TestNewTakesTheDialectFromTheDialector(t *testing.T) {
	want := map[string]sqlstore.Dialect{"postgres": sqlstore.PostgreSQL, "mysql": sqlstore.MySQL, "sqlite": sqlstore.SQLite}
	eachBackend(t, func(t *testing.T, b backend) {
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		require.Equal(t, want[b.name], s.Dialect())
		var gdb *gorm.DB
		require.True(t, s.As(&gdb), "As reaches the *gorm.DB")
		require.Same(t, db, gdb)
		var sdb *sql.DB
		require.True(t, s.As(&sdb), "and gorm's *sql.DB")
		require.Same(t, sqlDB(t, db), sdb)
	})
}

// TestTransactAppRowAndMessagesShareOneTransaction: the application's row, written
// through Tx, and the messages sent with fn's ctx commit together and roll back
// together, in both write modes.
func TestTransactAppRowAndMessagesShareOneTransaction(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		orders := businessTable(t, db)
		boom := errors.New("payment declined")
		id, committed := 0, 0
		for _, mode := range modes {
			sender := capture(t, s, mode)

			id++
			err := s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, insertOrder(ctx, orders, id, "rolled back"))
				require.NoError(t, sender.Send(ctx, orderMsg(id)))
				require.NoError(t, sender.Send(ctx, orderMsg(id)))
				require.Equal(t, committed, countRows(t, db, s.Config().Table), "%v: nothing is written before the commit", mode)
				return boom
			})
			require.ErrorIs(t, err, boom, "fn's error comes back as is")
			require.Equal(t, committed, countRows(t, db, orders), "%v: the application's row rolled back", mode)
			require.Equal(t, committed, countRows(t, db, s.Config().Table), "%v: the messages rolled back with it", mode)

			id++
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, insertOrder(ctx, orders, id, "committed"))
				return sender.Send(ctx, orderMsg(id))
			}))
			committed++
		}
		require.Equal(t, len(modes), countRows(t, db, orders), "each committed unit wrote its row")
		require.Equal(t, len(modes), countRows(t, db, s.Config().Table), "and its message")
	})
}

// TestAccessors: inside the unit, Tx is gorm's transaction bound to the unit's ctx and
// sqlstore.SQLTx the *sql.Tx under it; outside the unit, after it ended, and on a store
// built without gorm, Tx finds nothing.
func TestAccessors(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		outer := testContext(t)
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		var leaked context.Context
		require.NoError(t, s.Transact(outer, func(ctx context.Context) error {
			leaked = ctx
			gtx, ok := gormstore.Tx(ctx)
			require.True(t, ok, "Tx")
			require.True(t, driver.InUnit(gtx.Statement.Context, s), "Tx is bound to the unit's ctx, so gorm hooks send into the unit")
			stx, ok := sqlstore.SQLTx(ctx)
			require.True(t, ok, "sqlstore.SQLTx: the *sql.Tx under gorm's transaction")
			require.Same(t, stx, gtx.Statement.ConnPool)
			_, ok = sqlstore.PgxTx(ctx)
			require.False(t, ok)
			_, ok = gormstore.Tx(outer)
			require.False(t, ok, "the ctx Transact was called with carries no transaction")
			return nil
		}))
		_, ok := gormstore.Tx(leaked)
		require.False(t, ok, "no transaction once the unit ended")
		_, ok = sqlstore.SQLTx(leaked)
		require.False(t, ok)

		plain, err := sqlstore.NewDB(sqlDB(t, db), s.Dialect(), s.Config())
		require.NoError(t, err)
		defer plain.Close()
		require.NoError(t, plain.Transact(outer, func(ctx context.Context) error {
			_, ok := gormstore.Tx(ctx)
			require.False(t, ok, "a store built with NewDB has no gorm transaction")
			return nil
		}))
	})
}

// TestNestedTransactIsASavepoint: an inner Transact runs in the outer gorm
// transaction, as a savepoint: when it fails, its row and its messages are undone
// and the outer unit commits the rest; when it succeeds, the outer rollback removes
// its row and messages and the outer commit writes them.
func TestNestedTransactIsASavepoint(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		orders := businessTable(t, db)
		sender := capture(t, s, outbox.Transactional)
		unit := func(ctx context.Context, id int) error {
			if err := insertOrder(ctx, orders, id, "x"); err != nil {
				return err
			}
			return sender.Send(ctx, orderMsg(id))
		}
		pool := func(ctx context.Context) gorm.ConnPool {
			tx, _ := gormstore.Tx(ctx)
			return tx.Statement.ConnPool
		}
		boom := errors.New("outer failed")
		err := s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, unit(ctx, 1))
			outer := pool(ctx)
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
				require.Equal(t, outer, pool(ctx), "the inner unit runs in the outer transaction")
				return unit(ctx, 2)
			}))
			require.Zero(t, countRows(t, db, s.Config().Table), "the inner unit does not commit on its own")
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Zero(t, countRows(t, db, orders), "the outer rollback takes the inner unit's row")
		require.Zero(t, countRows(t, db, s.Config().Table), "and its message")

		declined := errors.New("inner failed")
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			if err := unit(ctx, 3); err != nil {
				return err
			}
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error { return unit(ctx, 4) }))
			err := s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, unit(ctx, 5))
				return declined
			})
			require.ErrorIs(t, err, declined, "the inner error reaches the outer function")
			return unit(ctx, 6)
		}))
		var ids []int
		require.NoError(t, db.Table(orders).Order("id").Pluck("id", &ids).Error)
		require.Equal(t, []int{3, 4, 6}, ids, "the failed inner unit's row was undone, the rest committed")
		require.Equal(t, 3, countRows(t, db, s.Config().Table), "and so was its message")
	})
}

// TestPanicInTransactRollsBack: a panic in fn rolls back gorm's transaction with the
// message, goes on to the caller, and leaves the connection usable.
func TestPanicInTransactRollsBack(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		orders := businessTable(t, db)
		sender := capture(t, s, outbox.Transactional)
		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, insertOrder(ctx, orders, 1, "x"))
				require.NoError(t, sender.Send(ctx, orderMsg(1)))
				panic("handler bug")
			})
			return nil
		}()
		require.Equal(t, "handler bug", recovered, "the panic goes on")
		require.Zero(t, countRows(t, db, orders), "the row rolled back")
		require.Zero(t, countRows(t, db, s.Config().Table), "the message rolled back")

		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			if err := insertOrder(ctx, orders, 1, "x"); err != nil {
				return err
			}
			return sender.Send(ctx, orderMsg(1))
		}))
		require.Equal(t, 1, countRows(t, db, orders))
		require.Equal(t, 1, countRows(t, db, s.Config().Table))
	})
}

// hookedOrder sends its message from gorm's AfterCreate hook, with the hook's ctx.
type hookedOrder struct {
	ID     int64
	Note   string
	sender outbox.Sender
}

func (o *hookedOrder) AfterCreate(tx *gorm.DB) error {
	return o.sender.Send(tx.Statement.Context, orderMsg(int(o.ID)))
}

// TestHookSendsJoinTheUnit: a send made in a gorm hook with tx.Statement.Context is
// staged on the unit, so it commits and rolls back with the row.
func TestHookSendsJoinTheUnit(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		orders := businessTable(t, db)
		sender := capture(t, s, outbox.Transactional)
		create := func(ctx context.Context, id int64) error {
			tx, _ := gormstore.Tx(ctx)
			return tx.Table(orders).Create(&hookedOrder{ID: id, Note: "x", sender: sender}).Error
		}
		boom := errors.New("declined")
		require.ErrorIs(t, s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, create(ctx, 1))
			return boom
		}), boom)
		require.Zero(t, countRows(t, db, orders))
		require.Zero(t, countRows(t, db, s.Config().Table), "the hook's message rolled back with the row")

		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error { return create(ctx, 2) }))
		require.Equal(t, 1, countRows(t, db, orders))
		require.Equal(t, 1, countRows(t, db, s.Config().Table), "the hook's message committed with the row")
	})
}

// TestEnqueueTxRollsBackWithTheApplication: in a gorm transaction the application
// manages (db.Begin, db.Transaction), EnqueueTx takes the scope's messages; they
// roll back and commit with the transaction, and NotifyCommitted wakes a subscriber.
func TestEnqueueTxRollsBackWithTheApplication(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		orders := businessTable(t, db)
		sub := s.Driver().(driver.Notifier).Subscribe(ctx)
		sender := capture(t, s, outbox.Transactional)

		sctx, scope := outbox.NewScope(ctx)
		defer scope.Release()
		tx := db.WithContext(sctx).Begin()
		require.NoError(t, tx.Error)
		require.NoError(t, tx.Exec("INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 1, "x").Error)
		require.NoError(t, sender.Send(sctx, orderMsg(1)))
		written, err := gormstore.EnqueueTx(sctx, s, tx, orderMsg(2))
		require.NoError(t, err)
		require.Len(t, written, 2, "the staged message and the call's")
		require.Zero(t, scope.Len(), "the staged message was taken")
		require.NoError(t, tx.Rollback().Error)
		require.Zero(t, countRows(t, db, orders))
		require.Zero(t, countRows(t, db, s.Config().Table), "the messages rolled back with the row")

		require.NoError(t, db.WithContext(sctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 3, "x").Error; err != nil {
				return err
			}
			if err := sender.Send(sctx, orderMsg(3)); err != nil {
				return err
			}
			written, err = gormstore.EnqueueTx(sctx, s, tx)
			return err
		}))
		require.Len(t, written, 1)
		s.NotifyCommitted(written...)
		// On PostgreSQL the listener also wakes every bucket when it connects.
		timeout := time.After(10 * time.Second)
		for woke := false; !woke; {
			select {
			case bucket := <-sub:
				woke = bucket == written[0].Bucket
			case <-timeout:
				t.Fatal("NotifyCommitted woke no subscriber")
			}
		}
		require.Equal(t, 1, countRows(t, db, orders))
		require.Equal(t, 1, countRows(t, db, s.Config().Table))
	})
}

// TestMisuseIsExplained: what New and EnqueueTx refuse, with ErrMisconfigured and
// the fix.
func TestMisuseIsExplained(t *testing.T) {
	ctx := testContext(t)
	db := sqliteGorm(t, nil)

	_, err := gormstore.New(nil, sqlstore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = gormstore.New(&gorm.DB{}, sqlstore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "a *gorm.DB not opened with gorm.Open")
	_, err = gormstore.New(&gorm.DB{Config: &gorm.Config{Dialector: renamed{db.Dialector}}}, sqlstore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, `"sqlserver"`)
	require.ErrorContains(t, err, "postgres, mysql or sqlite")
	_, err = gormstore.New(db, sqlstore.Config{Table: "bad-name"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Config.Table", "the config is validated as by NewDB")

	s := open(t, db, sqlstore.Config{})
	tx := db.Begin()
	_, err = gormstore.EnqueueTx(ctx, nil, tx)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.NoError(t, tx.Rollback().Error)
	_, err = gormstore.EnqueueTx(ctx, s, nil)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = gormstore.EnqueueTx(ctx, s, db)
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "a *gorm.DB outside a transaction is refused")
	require.ErrorContains(t, err, "db.Begin")

	_, ok := gormstore.Tx(ctx)
	require.False(t, ok, "outside a unit of work Tx finds nothing")
}

// renamed is a dialector gormstore does not support.
type renamed struct{ gorm.Dialector }

func (renamed) Name() string { return "sqlserver" }

// TestWithTxOptions: the options reach gorm's Begin: a read-only unit refuses the
// application's write, an isolation level is applied.
func TestWithTxOptions(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		db := b.db(t)
		s := open(t, db, sqlstore.Config{})
		orders := businessTable(t, db)
		sender := capture(t, s, outbox.Transactional)
		readOnly := sqlstore.WithTxOptions(ctx, sql.TxOptions{ReadOnly: true})
		if s.Dialect() != sqlstore.SQLite { // SQLite's driver begins a plain transaction
			err := s.Transact(readOnly, func(ctx context.Context) error { return insertOrder(ctx, orders, 1, "x") })
			require.Error(t, err, "a read-only transaction refuses the application's write")
			err = s.Transact(readOnly, func(ctx context.Context) error { return sender.Send(ctx, orderMsg(1)) })
			require.Error(t, err, "and the outbox's")
			require.Zero(t, countRows(t, db, orders))
			require.Zero(t, countRows(t, db, s.Config().Table))
		}
		require.NoError(t, s.Transact(readOnly, func(context.Context) error { return nil }), "a read-only unit that writes nothing commits")

		if s.Dialect() == sqlstore.PostgreSQL {
			serializable := sqlstore.WithTxOptions(ctx, sql.TxOptions{Isolation: sql.LevelSerializable})
			require.NoError(t, s.Transact(serializable, func(ctx context.Context) error {
				tx, _ := gormstore.Tx(ctx)
				var level string
				require.NoError(t, tx.Raw("SHOW transaction_isolation").Row().Scan(&level))
				require.Equal(t, "serializable", level)
				return sender.Send(ctx, orderMsg(2))
			}))
			require.Equal(t, 1, countRows(t, db, s.Config().Table))
		}
	})
}

// TestPrepareStmtMode: with gorm's PrepareStmt, gorm's transaction wraps the *sql.Tx;
// the unit, Tx, sqlstore.SQLTx and EnqueueTx work as in the default mode.
func TestPrepareStmtMode(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		prepared := b.db(t).Session(&gorm.Session{PrepareStmt: true})
		s := open(t, prepared, sqlstore.Config{})
		orders := businessTable(t, prepared)
		sender := capture(t, s, outbox.Transactional)

		boom := errors.New("declined")
		require.ErrorIs(t, s.Transact(ctx, func(ctx context.Context) error {
			tx, _ := gormstore.Tx(ctx)
			_, isPrepared := tx.Statement.ConnPool.(*gorm.PreparedStmtTX)
			require.True(t, isPrepared, "gorm's transaction is its prepared-statement wrapper")
			_, ok := sqlstore.SQLTx(ctx)
			require.True(t, ok, "sqlstore.SQLTx reaches the *sql.Tx under it")
			require.NoError(t, insertOrder(ctx, orders, 1, "x"))
			require.NoError(t, sender.Send(ctx, orderMsg(1)))
			return boom
		}), boom)
		require.Zero(t, countRows(t, prepared, orders))
		require.Zero(t, countRows(t, prepared, s.Config().Table))

		for id := 2; id <= 3; id++ { // the second unit runs the application's statement prepared
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
				if err := insertOrder(ctx, orders, id, "x"); err != nil {
					return err
				}
				return sender.Send(ctx, orderMsg(id))
			}))
		}
		require.Equal(t, 2, countRows(t, prepared, orders))
		require.Equal(t, 2, countRows(t, prepared, s.Config().Table))

		sctx, scope := outbox.NewScope(ctx)
		defer scope.Release()
		require.NoError(t, prepared.WithContext(sctx).Transaction(func(tx *gorm.DB) error {
			if err := sender.Send(sctx, orderMsg(4)); err != nil {
				return err
			}
			_, err := gormstore.EnqueueTx(sctx, s, tx)
			return err
		}))
		require.Equal(t, 3, countRows(t, prepared, s.Config().Table))
	})
}

// wrappedPool is a custom gorm connection pool whose transactions are not *sql.Tx.
type wrappedPool struct{ *sql.DB }

func (p wrappedPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	tx, err := p.DB.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &wrappedTx{tx}, nil
}

func (p wrappedPool) GetDBConn() (*sql.DB, error) { return p.DB, nil }

type wrappedTx struct{ *sql.Tx }

// TestCustomConnPoolIsRefused: a gorm transaction that is not a *sql.Tx underneath
// is refused with ErrMisconfigured, by the unit before fn runs and by EnqueueTx,
// and the transaction gorm began is rolled back.
func TestCustomConnPoolIsRefused(t *testing.T) {
	ctx := testContext(t)
	raw := sqlDB(t, sqliteGorm(t, nil))
	db, err := gorm.Open(&sqlite.Dialector{Conn: wrappedPool{raw}}, quietGorm())
	require.NoError(t, err)
	s := open(t, db, sqlstore.Config{})

	ran := false
	err = s.Transact(ctx, func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "not a *sql.Tx")
	require.False(t, ran)

	tx := db.Begin()
	require.NoError(t, tx.Error)
	defer tx.Rollback()
	_, err = gormstore.EnqueueTx(ctx, s, tx)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "not a *sql.Tx")
	tx.Rollback()

	// The refused unit left no transaction open: SQLite would otherwise stay locked.
	require.NoError(t, s.Enqueue(ctx, orderMsg(1)))
}

// TestSQLiteConcurrentWritersAndRelayNeverBusy: units of work begun by gorm (read
// then write) and Immediate writes, from eight writers beside a running relay, never
// see SQLITE_BUSY.
func TestSQLiteConcurrentWritersAndRelayNeverBusy(t *testing.T) {
	ctx := testContext(t)
	db := sqliteGorm(t, nil)
	s := open(t, db, sqlstore.Config{})
	orders := businessTable(t, db)
	rec := outboxtest.NewRecorder()
	d, err := relay.New(s, rec, relay.Config{BucketCount: s.Config().BucketCount, PollInterval: 5 * time.Millisecond, BatchSize: 50, Logger: quietLog})
	require.NoError(t, err)
	require.NoError(t, d.Start(ctx))
	sender := capture(t, s, outbox.Transactional)

	const writers, perWriter = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers*perWriter*2)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				id := w*perWriter + i
				err := s.Transact(ctx, func(ctx context.Context) error {
					if err := insertOrder(ctx, orders, id, "x"); err != nil {
						return err
					}
					// Read then write inside the transaction: the pattern that fails
					// with SQLITE_BUSY under deferred transactions.
					if err := sender.Send(ctx, orderMsg(id)); err != nil {
						return err
					}
					tx, _ := gormstore.Tx(ctx)
					return tx.Exec("UPDATE "+orders+" SET note = ? WHERE id = ?", "sent", id).Error
				})
				if err != nil {
					errs <- err
				}
				if i%10 == 0 {
					// Immediate writes compete as well.
					if err := s.Enqueue(ctx, outbox.Message{Topic: "orders", Key: []byte("direct"), Payload: fmt.Append(nil, id)}); err != nil {
						errs <- err
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("writer saw an error (SQLITE_BUSY must never reach callers): %v", err)
	}
	total := writers*perWriter + writers*perWriter/10
	require.NoError(t, rec.WaitFor(ctx, total))
	require.NoError(t, d.Stop(ctx))
	require.NoError(t, d.Err())
	require.Equal(t, total, rec.Unique())
	require.Equal(t, writers*perWriter, countRows(t, db, orders))
}
