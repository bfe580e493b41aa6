package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/internal/orm"
)

var modes = []outbox.WriteMode{outbox.Transactional, outbox.Immediate}

// orderMsg is the message an order's unit of work sends.
func orderMsg(id int) outbox.Message {
	return outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", id), Payload: []byte("created")}
}

// TestTransactAppRowAndMessagesShareOneTransaction: the application's row, written
// through the client's accessor, and the messages sent with fn's ctx commit together
// and roll back together, in both write modes.
func TestTransactAppRowAndMessagesShareOneTransaction(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		orders := businessTable(t, s)
		boom := errors.New("payment declined")
		id, committed := 0, 0
		for _, mode := range modes {
			sender := capture(t, s, mode)

			id++
			err := s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, execInUnit(ctx, s, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", id, "rolled back"))
				require.NoError(t, sender.Send(ctx, orderMsg(id)))
				require.NoError(t, sender.Send(ctx, orderMsg(id)))
				require.Equal(t, committed, countRows(t, s, s.Config().Table), "%v: nothing is written before the commit", mode)
				return boom
			})
			require.ErrorIs(t, err, boom, "fn's error comes back as is")
			require.Equal(t, committed, countRows(t, s, orders), "%v: the application's row rolled back", mode)
			require.Equal(t, committed, countRows(t, s, s.Config().Table), "%v: the messages rolled back with it", mode)

			id++
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, execInUnit(ctx, s, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", id, "committed"))
				return sender.Send(ctx, orderMsg(id))
			}))
			committed++
		}
		require.Equal(t, len(modes), countRows(t, s, orders), "each committed unit wrote its row")
		require.Equal(t, len(modes), countRows(t, s, s.Config().Table), "and its message")
	})
}

// TestAccessorsMatchTheClient: each client has its accessor, the others report
// false; outside the unit, inside another store's unit, and after it ended (a nested
// unit's ctx too), none finds a transaction.
func TestAccessorsMatchTheClient(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		outer := testContext(t)
		s := b.open(t, sqlstore.Config{})
		mem, err := memstore.New(memstore.Config{})
		require.NoError(t, err)
		require.NoError(t, mem.Transact(outer, func(ctx context.Context) error {
			_, ok := sqlstore.PgxTx(ctx)
			require.False(t, ok, "a memory store's unit has no SQL transaction")
			_, ok = sqlstore.SQLTx(ctx)
			require.False(t, ok)
			_, ok = orm.TxHandle(ctx)
			require.False(t, ok)
			return nil
		}))
		var leaked, leakedNested context.Context
		require.NoError(t, s.Transact(outer, func(ctx context.Context) error {
			leaked = ctx
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
				leakedNested = ctx
				_, isPgx := sqlstore.PgxTx(ctx)
				_, isSQL := sqlstore.SQLTx(ctx)
				require.True(t, isPgx || isSQL, "a nested unit reaches the transaction")
				return nil
			}))
			_, isPgx := sqlstore.PgxTx(ctx)
			_, isSQL := sqlstore.SQLTx(ctx)
			_, hasHandle := orm.TxHandle(ctx)
			require.Equal(t, b.client == "pgx", isPgx, "PgxTx")
			require.Equal(t, b.client == "database/sql", isSQL, "SQLTx")
			require.False(t, hasHandle, "orm.TxHandle: only a store built with NewORM")
			if tx, ok := sqlstore.PgxTx(ctx); ok {
				require.ErrorIs(t, tx.Commit(ctx), outbox.ErrMisconfigured, "the unit commits its own transaction")
				require.ErrorIs(t, tx.Rollback(ctx), outbox.ErrMisconfigured)
			}
			_, ok := sqlstore.SQLTx(outer)
			require.False(t, ok, "the ctx Transact was called with carries no transaction")
			return nil
		}))
		_, ok := sqlstore.PgxTx(leaked)
		require.False(t, ok, "no transaction once the unit ended")
		_, ok = sqlstore.SQLTx(leaked)
		require.False(t, ok)
		_, ok = orm.TxHandle(leaked)
		require.False(t, ok)
		_, ok = sqlstore.PgxTx(leakedNested)
		require.False(t, ok, "nor on a nested unit's ctx")
		_, ok = sqlstore.SQLTx(leakedNested)
		require.False(t, ok)
	})
}

// TestNestedTransactIsASavepoint: an inner Transact runs in the outer transaction.
// When it succeeds, its row and messages commit or roll back with the outer unit.
func TestNestedTransactIsASavepoint(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		orders := businessTable(t, s)
		sender := capture(t, s, outbox.Transactional)
		unit := func(ctx context.Context, id int) error {
			if err := execInUnit(ctx, s, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", id, "x"); err != nil {
				return err
			}
			return sender.Send(ctx, orderMsg(id))
		}
		boom := errors.New("outer failed")
		err := s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, unit(ctx, 1))
			outer := sameTx(ctx)
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
				require.Equal(t, outer, sameTx(ctx), "the inner unit runs in the outer transaction")
				return unit(ctx, 2)
			}))
			require.Zero(t, countRows(t, s, s.Config().Table), "the inner unit does not commit on its own")
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Zero(t, countRows(t, s, orders), "the outer rollback takes the inner unit's row")
		require.Zero(t, countRows(t, s, s.Config().Table), "and its message")

		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			if err := unit(ctx, 3); err != nil {
				return err
			}
			return s.Transact(ctx, func(ctx context.Context) error { return unit(ctx, 4) })
		}))
		require.Equal(t, []int{3, 4}, orderIDs(t, s, orders))
		require.Equal(t, 2, countRows(t, s, s.Config().Table))
	})
}

// TestFailedNestedTransactUndoesItsOwnWrites: a nested Transact that fails (by
// returning an error, after a failed statement, or by panicking) rolls back to its
// savepoint: its rows and its messages are gone, the outer unit goes on in the same
// transaction (on PostgreSQL too, where the failed statement had aborted it) and
// commits everything else.
func TestFailedNestedTransactUndoesItsOwnWrites(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		orders := businessTable(t, s)
		sender := capture(t, s, outbox.Transactional)
		insert := func(ctx context.Context, id int) error {
			return execInUnit(ctx, s, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", id, "x")
		}
		unit := func(ctx context.Context, id int) error {
			if err := insert(ctx, id); err != nil {
				return err
			}
			return sender.Send(ctx, orderMsg(id))
		}
		declined := errors.New("declined")
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, unit(ctx, 1))
			outer := sameTx(ctx)

			// The inner function returns an error.
			err := s.Transact(ctx, func(ctx context.Context) error {
				require.Equal(t, outer, sameTx(ctx))
				require.NoError(t, unit(ctx, 2))
				return declined
			})
			require.ErrorIs(t, err, declined, "the inner error comes back as is")

			// A statement of the inner function fails (a duplicate key).
			err = s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, unit(ctx, 3))
				return insert(ctx, 1)
			})
			require.Error(t, err)

			// The inner function panics; the outer one recovers.
			recovered := func() (r any) {
				defer func() { r = recover() }()
				_ = s.Transact(ctx, func(ctx context.Context) error {
					require.NoError(t, unit(ctx, 4))
					panic("handler bug")
				})
				return nil
			}()
			require.Equal(t, "handler bug", recovered)

			// Savepoints nest: the innermost fails, the one around it commits.
			require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, unit(ctx, 5))
				err := s.Transact(ctx, func(ctx context.Context) error {
					require.NoError(t, unit(ctx, 6))
					return declined
				})
				require.ErrorIs(t, err, declined)
				return unit(ctx, 7)
			}))

			require.Equal(t, outer, sameTx(ctx), "the outer unit goes on in its transaction")
			return unit(ctx, 8) // the transaction is usable after every failure above
		}))
		require.Equal(t, []int{1, 5, 7, 8}, orderIDs(t, s, orders), "the failed inner units' rows were undone")
		fetched, err := drv(s).List(ctx, driver.Pending, driver.Cursor{}, 100)
		require.NoError(t, err)
		var keys []string
		for _, env := range fetched {
			keys = append(keys, string(env.Key))
		}
		require.ElementsMatch(t, []string{"order-1", "order-5", "order-7", "order-8"}, keys, "and so were their messages")
	})
}

// orderIDs returns the ids in an application table, in order.
func orderIDs(t *testing.T, s *sqlstore.Store, table string) []int {
	t.Helper()
	ctx := context.Background()
	var pool *pgxpool.Pool
	var db *sql.DB
	var ids []int
	switch {
	case s.As(&pool):
		rows, err := pool.Query(ctx, "SELECT id FROM "+table+" ORDER BY id")
		require.NoError(t, err)
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int])
		require.NoError(t, err)
	case s.As(&db):
		rows, err := db.QueryContext(ctx, "SELECT id FROM "+table+" ORDER BY id")
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var id int
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
	}
	return ids
}

// TestCheckSaysToMigrate: the relay side's Check, which a relay calls at Start,
// fails on a store whose tables are missing (or behind the code's migrations) with
// an error wrapping ErrMisconfigured that names the table and says to run Migrate,
// and passes once the store is migrated.
func TestCheckSaysToMigrate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s, err := b.build(t, withTable(sqlstore.Config{BucketCount: 2}))
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = s.Close()
			_ = s.DropTables(context.Background())
		})
		cfg := s.Config()
		requireMigrate := func(err error, table, what string) {
			t.Helper()
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			require.ErrorContains(t, err, "run Store.Migrate")
			require.ErrorContains(t, err, fmt.Sprintf("table %q %s", table, what))
		}
		requireMigrate(drv(s).Check(ctx), cfg.Table, "does not exist")
		d, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{BucketCount: 2, Logger: quietLog})
		require.NoError(t, err)
		err = d.Start(ctx)
		requireMigrate(err, cfg.Table, "does not exist")

		require.NoError(t, s.Migrate(ctx))
		require.NoError(t, drv(s).Check(ctx), "a migrated store passes")

		// A table the relay needs lacks a column of this version, or is missing.
		execDirect(t, s, "ALTER TABLE "+cfg.RelayTable+" DROP COLUMN bucket_count")
		requireMigrate(drv(s).Check(ctx), cfg.RelayTable, "lacks a column this version uses")
		execDirect(t, s, "DROP TABLE "+cfg.LeaseTable)
		requireMigrate(drv(s).Check(ctx), cfg.LeaseTable, "does not exist")

		require.NoError(t, s.Close())
		require.ErrorIs(t, drv(s).Check(ctx), outbox.ErrClosed)
	})
}

// sameTx identifies the transaction on ctx.
func sameTx(ctx context.Context) any {
	if tx, ok := sqlstore.PgxTx(ctx); ok {
		return tx.Conn()
	}
	tx, _ := sqlstore.SQLTx(ctx)
	return tx
}

// TestPanicInTransactRollsBack: a panic in fn rolls back the row and the message,
// and goes on to the caller.
func TestPanicInTransactRollsBack(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		orders := businessTable(t, s)
		sender := capture(t, s, outbox.Transactional)
		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, execInUnit(ctx, s, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 1, "x"))
				require.NoError(t, sender.Send(ctx, orderMsg(1)))
				panic("handler bug")
			})
			return nil
		}()
		require.Equal(t, "handler bug", recovered, "the panic goes on")
		require.Zero(t, countRows(t, s, orders), "the row rolled back")
		require.Zero(t, countRows(t, s, s.Config().Table), "the message rolled back")

		// The connection went back in a usable state.
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			if err := execInUnit(ctx, s, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 1, "x"); err != nil {
				return err
			}
			return sender.Send(ctx, orderMsg(1))
		}))
		require.Equal(t, 1, countRows(t, s, orders))
		require.Equal(t, 1, countRows(t, s, s.Config().Table))
	})
}

// TestSendWithTheOuterCtxFails: inside Transact, a send with the ctx Transact was
// called with is outside the unit: it fails and says which ctx to use.
func TestSendWithTheOuterCtxFails(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		outer := testContext(t)
		s := b.open(t, sqlstore.Config{})
		sender := capture(t, s, outbox.Transactional)
		require.NoError(t, s.Transact(outer, func(ctx context.Context) error {
			err := sender.Send(outer, orderMsg(1))
			require.ErrorIs(t, err, outbox.ErrNoTransaction)
			require.ErrorContains(t, err, "the ctx that Transact passes to its function")
			return nil
		}))
		require.Zero(t, countRows(t, s, s.Config().Table))
	})
}

// TestMissingTableSaysToMigrate: a store used before Migrate fails with an error
// wrapping ErrMisconfigured that says to run Migrate, on every path that touches a
// table, instead of a raw SQLSTATE or driver error.
func TestMissingTableSaysToMigrate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s, err := b.build(t, withTable(sqlstore.Config{BucketCount: 2}))
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = s.Close()
			_ = s.DropTables(context.Background())
		})
		requireMigrate := func(err error, call string) {
			t.Helper()
			require.ErrorIs(t, err, outbox.ErrMisconfigured, call)
			require.ErrorContains(t, err, "run Store.Migrate", call)
		}
		sender := capture(t, s, outbox.Transactional)
		now := time.Now()
		lease := driver.Lease{Bucket: 0, Owner: "relay", ExpiresAt: now.Add(time.Minute)}

		requireMigrate(s.Enqueue(ctx, newMessage("k", "v")), "Enqueue")
		requireMigrate(drv(s).Enqueue(ctx, newEnvelope(t, s, "k", "v")), "the relay side's Enqueue")
		requireMigrate(drv(s).Check(ctx), "Check")
		requireMigrate(capture(t, s, outbox.Immediate).Send(ctx, orderMsg(1)), "an Immediate send")
		requireMigrate(s.Transact(ctx, func(ctx context.Context) error { return sender.Send(ctx, orderMsg(1)) }), "Transact's commit")
		manual := beginManual(t, ctx, s)
		requireMigrate(manual.write(ctx, newMessage("k", "v")), "EnqueueTx")
		manual.rollback()
		_, err = drv(s).Fetch(ctx, 0, 10)
		requireMigrate(err, "Fetch")
		requireMigrate(drv(s).Complete(ctx, []*driver.Envelope{newEnvelope(t, s, "k", "v")}), "Complete")
		_, err = drv(s).ReadCoordination(ctx)
		requireMigrate(err, "ReadCoordination")
		_, err = drv(s).Claim(ctx, 0, "relay", now, now.Add(time.Minute))
		requireMigrate(err, "Claim")
		_, err = drv(s).Renew(ctx, lease, now, now.Add(2*time.Minute))
		requireMigrate(err, "Renew")
		_, err = drv(s).Release(ctx, lease)
		requireMigrate(err, "Release")
		_, err = drv(s).ReadRelays(ctx)
		requireMigrate(err, "ReadRelays")
		_, err = drv(s).Heartbeat(ctx, "relay", now, 2, driver.Instance{})
		requireMigrate(err, "Heartbeat")
		requireMigrate(drv(s).StopRelay(ctx, "relay", now), "StopRelay")

		require.NoError(t, s.Migrate(ctx))
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error { return sender.Send(ctx, orderMsg(1)) }), "after Migrate the store works")
		require.Equal(t, 1, countRows(t, s, s.Config().Table))
	})
}

// TestInvalidTextIsRefusedBeforeSQL: a NUL byte or invalid UTF-8 in a topic or a
// header key is ErrInvalidMessage on every write path, before any statement runs (on
// PostgreSQL it would otherwise be a raw SQLSTATE 22021).
func TestInvalidTextIsRefusedBeforeSQL(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		bad := []func(env *driver.Envelope){
			func(env *driver.Envelope) { env.Topic = "orders\x00" },
			func(env *driver.Envelope) { env.Topic = "orders\xff" },
			func(env *driver.Envelope) { env.Headers = []outbox.Header{{Key: "trace\x00id", Value: []byte("v")}} },
			func(env *driver.Envelope) { env.Headers = []outbox.Header{{Key: "\xc3\x28", Value: []byte("v")}} },
		}
		refused := func(err error, call string) {
			t.Helper()
			require.ErrorIs(t, err, outbox.ErrInvalidMessage, call)
			require.NotContains(t, err.Error(), "SQLSTATE", call)
			require.NotContains(t, err.Error(), "22021", call)
		}
		for i, spoil := range bad {
			env := newEnvelope(t, s, "k", "v")
			spoil(env)
			refused(drv(s).Enqueue(ctx, env), fmt.Sprintf("the relay side's Enqueue, case %d", i))
			refused(s.Enqueue(ctx, newMessage("k", "fine"), env.Message), fmt.Sprintf("Enqueue, case %d", i))

			manual := beginManual(t, ctx, s)
			refused(manual.write(ctx, newMessage("k", "fine"), env.Message), fmt.Sprintf("EnqueueTx, case %d", i))
			require.NoError(t, manual.commit(), "a refused EnqueueTx ran no statement: the transaction is intact")

			msg := env.Message
			err := s.Transact(ctx, func(ctx context.Context) error {
				return capture(t, s, outbox.Transactional).Send(ctx, msg)
			})
			refused(err, fmt.Sprintf("a send inside Transact, case %d", i))
		}
		require.Zero(t, countRows(t, s, s.Config().Table), "nothing of a refused call is written")
	})
}

// queryInUnit reads one text value in the unit of work on ctx.
func queryInUnit(t *testing.T, ctx context.Context, q string) string {
	t.Helper()
	var v string
	if tx, ok := sqlstore.PgxTx(ctx); ok {
		require.NoError(t, tx.QueryRow(ctx, q).Scan(&v))
		return v
	}
	tx, ok := sqlstore.SQLTx(ctx)
	require.True(t, ok)
	require.NoError(t, tx.QueryRowContext(ctx, q).Scan(&v))
	return v
}

// TestWithTxOptions: the next unit of work begins with the options: a read-only one
// refuses the application's write, an isolation level is applied, and options on the
// ctx of a nested Transact (a savepoint of a transaction already begun) are refused.
func TestWithTxOptions(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		orders := businessTable(t, s)
		sender := capture(t, s, outbox.Transactional)
		readOnly := sqlstore.WithTxOptions(ctx, sql.TxOptions{ReadOnly: true})

		if s.Dialect() != sqlstore.SQLite { // SQLite's driver begins a plain transaction
			err := s.Transact(readOnly, func(ctx context.Context) error {
				return execInUnit(ctx, s, "INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 1, "x")
			})
			require.Error(t, err, "a read-only transaction refuses the application's write")
			err = s.Transact(readOnly, func(ctx context.Context) error { return sender.Send(ctx, orderMsg(1)) })
			require.Error(t, err, "and the outbox's")
			require.Zero(t, countRows(t, s, orders))
			require.Zero(t, countRows(t, s, s.Config().Table))
		}
		require.NoError(t, s.Transact(readOnly, func(ctx context.Context) error { return nil }), "a read-only unit that writes nothing commits")

		if s.Dialect() == sqlstore.PostgreSQL {
			serializable := sqlstore.WithTxOptions(ctx, sql.TxOptions{Isolation: sql.LevelSerializable})
			require.NoError(t, s.Transact(serializable, func(ctx context.Context) error {
				require.Equal(t, "serializable", queryInUnit(t, ctx, "SHOW transaction_isolation"))
				return sender.Send(ctx, orderMsg(2))
			}))
			require.Equal(t, 1, countRows(t, s, s.Config().Table))
		}

		// The options were for one transaction: the ctx fn gets carries none, so a
		// nested unit is fine; options that a nested unit could not honour are refused.
		require.NoError(t, s.Transact(readOnly, func(ctx context.Context) error {
			require.NoError(t, s.Transact(ctx, func(context.Context) error { return nil }))
			err := s.Transact(sqlstore.WithTxOptions(ctx, sql.TxOptions{}), func(context.Context) error { return nil })
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			require.ErrorContains(t, err, "outermost Transact")
			return nil
		}))

		if b.client == "pgx" {
			err := s.Transact(sqlstore.WithTxOptions(ctx, sql.TxOptions{Isolation: sql.LevelLinearizable}), func(context.Context) error { return nil })
			require.ErrorIs(t, err, outbox.ErrMisconfigured, "PostgreSQL has no such level")
		}
	})
}

// commitTracer records the statements and batches a pgx connection sends.
type commitTracer struct {
	mu     sync.Mutex
	events []string
}

func (c *commitTracer) record(e string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, e)
}

func (c *commitTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	c.record("query: " + d.SQL)
	return ctx
}

func (c *commitTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *commitTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var qs []string
	for _, q := range d.Batch.QueuedQueries {
		qs = append(qs, q.SQL)
	}
	c.record("batch: " + strings.Join(qs, " | "))
	return ctx
}

func (c *commitTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *commitTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestPgxCommitIsPipelined: on pgx, the unit's multi-row INSERT and its COMMIT are
// sent as one batch, one round trip.
func TestPgxCommitIsPipelined(t *testing.T) {
	ctx := testContext(t)
	postgresPool(t) // skips, or fails under CI, when the server is down
	cfg, err := pgxpool.ParseConfig(postgresURL())
	require.NoError(t, err)
	tracer := &commitTracer{}
	cfg.ConnConfig.Tracer = tracer
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := sqlstore.NewPgx(pool, withTable(sqlstore.Config{DisableNotify: true}))
	s = migrated(t, s, err)
	orders := businessTable(t, s)
	sender := capture(t, s, outbox.Transactional)
	// A store's first write reads the recorded bucket count once; measure after it.
	require.NoError(t, s.Enqueue(ctx, orderMsg(100)))

	tracer.mu.Lock()
	tracer.events = nil
	tracer.mu.Unlock()
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		tx, _ := sqlstore.PgxTx(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id, note) VALUES (1, 'x')"); err != nil {
			return err
		}
		for i := range 3 {
			if err := sender.Send(ctx, orderMsg(i)); err != nil {
				return err
			}
		}
		return nil
	}))
	tracer.mu.Lock()
	events := tracer.events
	tracer.mu.Unlock()
	require.Len(t, events, 3, "begin, the application's statement, one batch: %q", events)
	require.Equal(t, "query: begin", strings.ToLower(events[0]))
	batch := strings.Split(strings.TrimPrefix(events[2], "batch: "), " | ")
	require.Len(t, batch, 2, "the batch holds the INSERT and the COMMIT: %q", events[2])
	require.True(t, strings.HasPrefix(batch[0], "INSERT INTO "+s.Config().Table+" "), "one INSERT for all three messages: %q", batch[0])
	require.Equal(t, "COMMIT", batch[1])
	require.Equal(t, 4, countRows(t, s, s.Config().Table), "the three and the first write")
}
