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
	"github.com/outboxkit/outbox/store/sqlstore"
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
			require.Zero(t, sender.Abandoned(), "a rollback is not an abandonment")

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
// false; outside the unit, and after it ended, none finds a transaction.
func TestAccessorsMatchTheClient(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		outer := testContext(t)
		s := b.open(t, sqlstore.Config{})
		var leaked context.Context
		require.NoError(t, s.Transact(outer, func(ctx context.Context) error {
			leaked = ctx
			_, isPgx := sqlstore.PgxTx(ctx)
			_, isSQL := sqlstore.Tx(ctx)
			_, hasHandle := sqlstore.TxHandle(ctx)
			require.Equal(t, b.client == "pgx", isPgx, "PgxTx")
			require.Equal(t, b.client == "database/sql", isSQL, "Tx")
			require.False(t, hasHandle, "TxHandle: only a store built with NewORM")
			if tx, ok := sqlstore.PgxTx(ctx); ok {
				require.ErrorIs(t, tx.Commit(ctx), outbox.ErrMisconfigured, "the unit commits its own transaction")
				require.ErrorIs(t, tx.Rollback(ctx), outbox.ErrMisconfigured)
			}
			_, ok := sqlstore.Tx(outer)
			require.False(t, ok, "the ctx Transact was called with carries no transaction")
			return nil
		}))
		_, ok := sqlstore.PgxTx(leaked)
		require.False(t, ok, "no transaction once the unit ended")
		_, ok = sqlstore.Tx(leaked)
		require.False(t, ok)
		_, ok = sqlstore.TxHandle(leaked)
		require.False(t, ok)
	})
}

// TestNestedTransactJoinsOuter: an inner Transact runs in the outer transaction; the
// outer rollback removes the inner's row and messages, the outer commit writes them.
func TestNestedTransactJoinsOuter(t *testing.T) {
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
		require.Equal(t, 2, countRows(t, s, orders))
		require.Equal(t, 2, countRows(t, s, s.Config().Table))
	})
}

// sameTx identifies the transaction on ctx.
func sameTx(ctx context.Context) any {
	if tx, ok := sqlstore.PgxTx(ctx); ok {
		return tx.Conn()
	}
	tx, _ := sqlstore.Tx(ctx)
	return tx
}

// TestPanicInTransactRollsBack: a panic in fn rolls back the row and the message,
// goes on to the caller, and is not reported as abandoned.
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
		require.Zero(t, sender.Abandoned(), "a panic is not an abandonment")

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
		lease := outbox.Lease{Bucket: 0, Owner: "relay", ExpiresAt: now.Add(time.Minute)}

		requireMigrate(s.Enqueue(ctx, newEnvelope(t, s, "k", "v")), "Enqueue")
		requireMigrate(capture(t, s, outbox.Immediate).Send(ctx, orderMsg(1)), "an Immediate send")
		requireMigrate(s.Transact(ctx, func(ctx context.Context) error { return sender.Send(ctx, orderMsg(1)) }), "Transact's commit")
		manual := beginManual(t, ctx, s)
		requireMigrate(manual.enqueue(ctx, newEnvelope(t, s, "k", "v")), "EnqueueTx")
		manual.rollback()
		_, err = s.Fetch(ctx, 0, 10)
		requireMigrate(err, "Fetch")
		requireMigrate(s.Complete(ctx, []*outbox.Envelope{newEnvelope(t, s, "k", "v")}), "Complete")
		_, err = s.ReadCoordination(ctx)
		requireMigrate(err, "ReadCoordination")
		_, err = s.Claim(ctx, 0, "relay", now, now.Add(time.Minute))
		requireMigrate(err, "Claim")
		_, err = s.Renew(ctx, lease, now, now.Add(2*time.Minute))
		requireMigrate(err, "Renew")
		_, err = s.Release(ctx, lease)
		requireMigrate(err, "Release")
		_, err = s.ReadRelays(ctx)
		requireMigrate(err, "ReadRelays")
		_, err = s.Heartbeat(ctx, "relay", now, 2)
		requireMigrate(err, "Heartbeat")
		requireMigrate(s.StopRelay(ctx, "relay", now), "StopRelay")

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
		bad := []func(env *outbox.Envelope){
			func(env *outbox.Envelope) { env.Topic = "orders\x00" },
			func(env *outbox.Envelope) { env.Topic = "orders\xff" },
			func(env *outbox.Envelope) { env.Headers = []outbox.Header{{Key: "trace\x00id", Value: []byte("v")}} },
			func(env *outbox.Envelope) { env.Headers = []outbox.Header{{Key: "\xc3\x28", Value: []byte("v")}} },
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
			refused(s.Enqueue(ctx, env), fmt.Sprintf("Enqueue, case %d", i))

			manual := beginManual(t, ctx, s)
			refused(manual.enqueue(ctx, newEnvelope(t, s, "k", "fine"), env), fmt.Sprintf("EnqueueTx, case %d", i))
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
	tx, ok := sqlstore.Tx(ctx)
	require.True(t, ok)
	require.NoError(t, tx.QueryRowContext(ctx, q).Scan(&v))
	return v
}

// TestWithTxOptions: the next unit of work begins with the options: a read-only one
// refuses the application's write, an isolation level is applied, and options on a
// ctx that would join an open unit are refused.
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
		// joined unit is fine; options that a joined unit could not honour are refused.
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
	require.Equal(t, 3, countRows(t, s, s.Config().Table))
}
