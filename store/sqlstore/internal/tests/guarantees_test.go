package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// manualTx is a transaction the application manages, written through the client
// kind's EnqueueTx call.
type manualTx struct {
	enqueue  func(ctx context.Context, msgs ...outbox.Message) ([]*driver.Envelope, error)
	commit   func() error
	rollback func()
}

func beginManual(t *testing.T, ctx context.Context, s *sqlstore.Store) manualTx {
	t.Helper()
	var pool *pgxpool.Pool
	var db *sql.DB
	switch {
	case s.As(&pool):
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		return manualTx{
			enqueue: func(ctx context.Context, msgs ...outbox.Message) ([]*driver.Envelope, error) {
				return s.EnqueuePgxTx(ctx, tx, msgs...)
			},
			commit:   func() error { return tx.Commit(ctx) },
			rollback: func() { _ = tx.Rollback(ctx) },
		}
	case s.As(&db):
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		return manualTx{
			enqueue: func(ctx context.Context, msgs ...outbox.Message) ([]*driver.Envelope, error) {
				return s.EnqueueTx(ctx, tx, msgs...)
			},
			commit:   tx.Commit,
			rollback: func() { _ = tx.Rollback() },
		}
	}
	t.Fatal("store has no client")
	return manualTx{}
}

// write writes msgs in the transaction and returns the error alone.
func (m manualTx) write(ctx context.Context, msgs ...outbox.Message) error {
	_, err := m.enqueue(ctx, msgs...)
	return err
}

// enqueueOne writes msg in the transaction and returns its envelope.
func (m manualTx) enqueueOne(t *testing.T, ctx context.Context, msg outbox.Message) *driver.Envelope {
	t.Helper()
	written, err := m.enqueue(ctx, msg)
	require.NoError(t, err)
	require.Len(t, written, 1)
	return written[0]
}

// execDirect runs a statement outside any unit of work ('?' placeholders).
func execDirect(t *testing.T, s *sqlstore.Store, q string, args ...any) {
	t.Helper()
	ctx := context.Background()
	var pool *pgxpool.Pool
	var db *sql.DB
	var err error
	switch {
	case s.As(&pool):
		_, err = pool.Exec(ctx, rebind(q), args...)
	case s.As(&db):
		if s.Dialect() == sqlstore.PostgreSQL {
			q = rebind(q)
		}
		_, err = db.ExecContext(ctx, q, args...)
	}
	require.NoError(t, err)
}

func countRows(t *testing.T, s *sqlstore.Store, table string) int {
	t.Helper()
	ctx := context.Background()
	var pool *pgxpool.Pool
	var db *sql.DB
	var n int
	switch {
	case s.As(&pool):
		require.NoError(t, pool.QueryRow(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n))
	case s.As(&db):
		require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table).Scan(&n))
	}
	return n
}

// businessTable creates an application table beside the outbox tables.
func businessTable(t *testing.T, s *sqlstore.Store) string {
	name := uniqueTable() + "_orders"
	execDirect(t, s, "CREATE TABLE "+name+" (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(100) NOT NULL)")
	t.Cleanup(func() { execDirect(t, s, "DROP TABLE IF EXISTS "+name) })
	return name
}

func TestUnitOfWorkRollbackLeavesNoRow(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		orders := businessTable(t, s)
		boom := errors.New("boom")

		err := b.transact(ctx, s, func(ctx context.Context, exec execFunc) error {
			require.NoError(t, exec("INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 1, "first"))
			send(t, ctx, s, "order-1", "created")
			send(t, ctx, s, "order-1", "paid")
			return boom
		})
		require.ErrorIs(t, err, boom)
		require.Zero(t, countRows(t, s, orders), "the business row rolled back")
		require.Zero(t, countRows(t, s, s.Config().Table), "no outbox row survives a rollback")

		// A failed write of the outbox rolls the business row back too: two messages
		// with one ID make the INSERT fail at commit.
		twice := outbox.Message{ID: uuid.Must(uuid.NewV7()), Topic: "orders", Key: []byte("order-2"), Payload: []byte("created")}
		err = b.transact(ctx, s, func(ctx context.Context, exec execFunc) error {
			require.NoError(t, exec("INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 2, "second"))
			sender := capture(t, s, outbox.Transactional)
			require.NoError(t, sender.Send(ctx, twice))
			return sender.Send(ctx, twice)
		})
		require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		require.Zero(t, countRows(t, s, orders))
		require.Zero(t, countRows(t, s, s.Config().Table))

		// And a commit writes both.
		require.NoError(t, b.transact(ctx, s, func(ctx context.Context, exec execFunc) error {
			require.NoError(t, exec("INSERT INTO "+orders+" (id, note) VALUES (?, ?)", 3, "third"))
			send(t, ctx, s, "order-3", "created")
			return nil
		}))
		require.Equal(t, 1, countRows(t, s, orders))
		require.Equal(t, 1, countRows(t, s, s.Config().Table))
	})
}

// drain runs one dispatcher sweep over every bucket.
func drain(t *testing.T, ctx context.Context, s driver.Handle, rec driver.Transport) relay.Result {
	t.Helper()
	d, err := relay.New(s, rec, relay.Config{BucketCount: s.Driver().BucketCount(), RelayID: "sweeper", Logger: quietLog})
	require.NoError(t, err)
	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	return res
}

func TestCommitsInOppositeOrderToSeqAreBothDelivered(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		// One bucket, so both messages share it and the relay reads them in Seq order.
		s := b.open(t, sqlstore.Config{BucketCount: 1})
		if s.Dialect() == sqlstore.SQLite {
			// SQLite has one writer: a second write waits for the first transaction
			// to commit, so commit order is Seq order and nothing can be skipped.
			first := beginManual(t, ctx, s)
			a := first.enqueueOne(t, ctx, newMessage("a", "1"))
			second := newEnvelope(t, s, "b", "2")
			done := make(chan error, 1)
			go func() { done <- drv(s).Enqueue(ctx, second) }()
			select {
			case err := <-done:
				t.Fatalf("the second writer did not wait for the first: %v", err)
			case <-time.After(200 * time.Millisecond):
			}
			require.NoError(t, first.commit())
			require.NoError(t, <-done, "the waiting writer succeeds once the lock is free")
			require.Less(t, a.Seq, second.Seq)
			rec := outboxtest.NewRecorder()
			require.Equal(t, 2, drain(t, ctx, s, rec).Published)
			return
		}
		rec := outboxtest.NewRecorder()
		early := beginManual(t, ctx, s)
		defer early.rollback()
		first := early.enqueueOne(t, ctx, newMessage("a", "early"))

		late := beginManual(t, ctx, s)
		defer late.rollback()
		second := late.enqueueOne(t, ctx, newMessage("b", "late"))
		require.Less(t, first.Seq, second.Seq)
		require.NoError(t, late.commit())

		// The relay sees only the later Seq while the earlier transaction is open.
		res := drain(t, ctx, s, rec)
		require.Equal(t, 1, res.Published)
		require.Equal(t, second.ID, rec.Messages()[0].ID)

		// The earlier Seq now sits below the one the relay already completed: the very
		// next sweep, which scans the bucket from its start, delivers it.
		require.NoError(t, early.commit())
		require.Equal(t, 1, drain(t, ctx, s, rec).Published, "the earlier Seq committed late was skipped")
		require.Equal(t, first.ID, rec.Messages()[1].ID)
		require.Zero(t, countRows(t, s, s.Config().Table))
	})
}

// ownerCheck is a transport that fails the test when two publishes of one bucket
// overlap, which only two owners of that bucket could cause.
type ownerCheck struct {
	next     driver.Transport
	inFlight sync.Map // bucket -> *atomic.Int32
	overlaps atomic.Int32
}

func (o *ownerCheck) Publish(ctx context.Context, batch []*driver.Envelope) error {
	buckets := map[int]bool{}
	for _, env := range batch {
		buckets[env.Bucket] = true
	}
	for b := range buckets {
		c, _ := o.inFlight.LoadOrStore(b, new(atomic.Int32))
		if c.(*atomic.Int32).Add(1) > 1 {
			o.overlaps.Add(1)
		}
		defer c.(*atomic.Int32).Add(-1)
	}
	time.Sleep(time.Millisecond) // widen the window an overlap would need
	return o.next.Publish(ctx, batch)
}

func TestTwoRelaysNeverOwnOneBucket(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		const buckets, messages = 4, 300
		s := b.open(t, sqlstore.Config{BucketCount: buckets})

		// The primitive: many relays claim every bucket at once; one wins each.
		now := time.Now().Truncate(time.Microsecond)
		wins := make([]atomic.Int32, buckets)
		var wg sync.WaitGroup
		for r := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for bucket := range buckets {
					ok, err := drv(s).Claim(ctx, bucket, fmt.Sprintf("relay-%d", r), now, now.Add(time.Minute))
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						wins[bucket].Add(1)
					}
				}
			}()
		}
		wg.Wait()
		for bucket := range buckets {
			require.EqualValues(t, 1, wins[bucket].Load(), "bucket %d", bucket)
		}
		c, err := drv(s).ReadCoordination(ctx)
		require.NoError(t, err)
		for _, l := range c.Leases {
			require.True(t, s.Config().BucketCount > l.Bucket)
			ok, err := drv(s).Release(ctx, l)
			require.NoError(t, err)
			require.True(t, ok)
		}

		// The protocol: two workers share a backlog; no bucket is published by both
		// at once and every key keeps its order.
		rec := outboxtest.NewRecorder()
		check := &ownerCheck{next: rec}
		var sent []*driver.Envelope
		for i := range messages {
			sent = append(sent, newEnvelope(t, s, fmt.Sprintf("key-%d", i%20), fmt.Sprint(i)))
		}
		require.NoError(t, drv(s).Enqueue(ctx, sent...))
		var workers []*relay.Relay
		for i := range 2 {
			d, err := relay.New(s, check, relay.Config{
				RelayID: fmt.Sprintf("worker-%d", i), BucketCount: buckets, BatchSize: 10,
				PollInterval: 20 * time.Millisecond, LeaseDuration: 900 * time.Millisecond,
				LeaseRenewInterval: 300 * time.Millisecond, Logger: quietLog,
			})
			require.NoError(t, err)
			require.NoError(t, d.Start(ctx))
			workers = append(workers, d)
		}
		require.NoError(t, rec.WaitForUnique(ctx, messages))
		for _, d := range workers {
			require.NoError(t, d.Stop(ctx))
		}
		require.Zero(t, check.overlaps.Load(), "two relays published one bucket at once")
		require.Equal(t, messages, rec.Unique())
		for key, envs := range rec.ByKey() {
			last := int64(0)
			for _, env := range envs {
				require.Greater(t, env.Seq, last, "key %s out of order", key)
				last = env.Seq
			}
		}
	})
}

func TestSQLiteConcurrentWritersAndRelayNeverBusy(t *testing.T) {
	for _, b := range backends {
		if b.name != "sqlite/database-sql" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			s := b.open(t, sqlstore.Config{})
			orders := businessTable(t, s)
			rec := outboxtest.NewRecorder()
			d, err := relay.New(s, rec, relay.Config{BucketCount: s.Config().BucketCount, PollInterval: 5 * time.Millisecond, BatchSize: 50, Logger: quietLog})
			require.NoError(t, err)
			require.NoError(t, d.Start(ctx))

			const writers, perWriter = 8, 40
			var wg sync.WaitGroup
			errs := make(chan error, writers*perWriter)
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range perWriter {
						id := w*perWriter + i
						err := b.transact(ctx, s, func(ctx context.Context, exec execFunc) error {
							if err := exec("INSERT INTO "+orders+" (id, note) VALUES (?, ?)", id, "x"); err != nil {
								return err
							}
							// Read then write inside the transaction: the pattern that
							// fails with SQLITE_BUSY under deferred transactions.
							send(t, ctx, s, fmt.Sprint(id), "created")
							return exec("UPDATE "+orders+" SET note = ? WHERE id = ?", "sent", id)
						})
						if err != nil {
							errs <- err
						}
						if i%10 == 0 {
							// Immediate writes compete as well.
							if err := drv(s).Enqueue(ctx, newEnvelope(t, s, "direct", fmt.Sprint(id))); err != nil {
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
			require.Equal(t, writers*perWriter, countRows(t, s, orders))
		})
	}
}

func TestListenNotifyWakesWorkerAcrossProcesses(t *testing.T) {
	eachPostgres(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		relayStore := b.open(t, sqlstore.Config{BucketCount: 2, Logger: quietLog})
		// A second store on the same tables stands for another process: its
		// commits cannot wake the relay's in-process hub.
		cfg := relayStore.Config()
		writer, err := sqlstore.NewPgx(postgresPool(t), sqlstore.Config{Table: cfg.Table, BucketCount: 2})
		require.NoError(t, err)
		defer writer.Close()

		rec := outboxtest.NewRecorder()
		d, err := relay.New(relayStore, rec, relay.Config{
			BucketCount: 2, PollInterval: time.Hour,
			LeaseDuration: 3 * time.Hour, LeaseRenewInterval: time.Hour, Logger: quietLog,
		})
		require.NoError(t, err)
		require.NoError(t, d.Start(ctx))
		defer func() { require.NoError(t, d.Stop(ctx)) }()
		require.Eventually(t, func() bool { return len(d.Owned()) == 2 }, 10*time.Second, 5*time.Millisecond)
		listenerPID := func() int {
			var pid int
			err := postgresPool(t).QueryRow(ctx,
				`SELECT pid FROM pg_stat_activity WHERE query = $1 AND state = 'idle'`, `LISTEN "`+cfg.NotifyChannel+`"`).Scan(&pid)
			if errors.Is(err, pgx.ErrNoRows) {
				return 0
			}
			require.NoError(t, err)
			return pid
		}
		require.Eventually(t, func() bool { return listenerPID() != 0 }, 10*time.Second, 5*time.Millisecond)
		firstPID := listenerPID()

		commit := func(payload string) {
			require.NoError(t, writer.Transact(ctx, func(ctx context.Context) error {
				send(t, ctx, writer, "k", payload)
				return nil
			}))
		}
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		commit("one")
		require.NoError(t, rec.WaitFor(waitCtx, 1), "only the notification can wake a worker polling hourly")

		// Drop the listening connection: the store reconnects and listens again.
		_, err = postgresPool(t).Exec(ctx, `SELECT pg_terminate_backend($1)`, firstPID)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			pid := listenerPID()
			return pid != 0 && pid != firstPID
		}, 10*time.Second, 10*time.Millisecond, "a new LISTEN session replaces the dropped one")
		commit("two")
		require.NoError(t, rec.WaitFor(waitCtx, 2), "a commit after the reconnect wakes the worker too")
		require.Equal(t, 2, rec.Unique())
	})
}

func TestDispatchOneReachesALateCommit(t *testing.T) {
	for _, b := range backends {
		if b.name == "sqlite/database-sql" {
			continue // the servers with concurrent writers only
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			s := b.open(t, sqlstore.Config{BucketCount: 1})
			rec := outboxtest.NewRecorder()
			early := beginManual(t, ctx, s)
			defer early.rollback()
			first := early.enqueueOne(t, ctx, newMessage("a", "early"))
			second := newEnvelope(t, s, "b", "late")
			require.NoError(t, drv(s).Enqueue(ctx, second))
			d, err := relay.New(s, rec, relay.Config{BucketCount: 1, RelayID: "stream", Logger: quietLog})
			require.NoError(t, err)
			res, err := d.DispatchOne(ctx, second.ID)
			require.NoError(t, err)
			require.Equal(t, 1, res.Published)
			require.NoError(t, early.commit())
			// Its own trigger finds it although the bucket head moved past its Seq.
			res, err = d.DispatchOne(ctx, first.ID)
			require.NoError(t, err)
			require.Equal(t, 1, res.Published)
			require.Equal(t, 2, rec.Unique())
		})
	}
}

// TestPgxPipelinedCommitFailure fails the pipelined COMMIT itself (a deferred
// constraint is checked there): nothing is written, the error names the commit, and
// the connection goes back to the pool clean.
func TestPgxPipelinedCommitFailure(t *testing.T) {
	ctx := testContext(t)
	s := backends[0].open(t, sqlstore.Config{})
	pool := postgresPool(t)
	orders := uniqueTable() + "_orders"
	_, err := pool.Exec(ctx, "CREATE TABLE "+orders+" (id BIGINT NOT NULL, CONSTRAINT "+orders+"_u UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+orders) })

	err = s.Transact(ctx, func(ctx context.Context) error {
		tx, ok := sqlstore.PgxTx(ctx)
		require.True(t, ok)
		if _, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id) VALUES (1), (1)"); err != nil {
			return err
		}
		send(t, ctx, s, "k", "v")
		return nil
	})
	require.ErrorContains(t, err, "commit")
	require.ErrorContains(t, err, "23505")
	require.Zero(t, countRows(t, s, orders))
	require.Zero(t, countRows(t, s, s.Config().Table), "the outbox row rolled back with the failed commit")

	// Every pooled connection still works outside a transaction.
	for range 20 {
		var status string
		require.NoError(t, pool.QueryRow(ctx, "SELECT 'idle'").Scan(&status))
	}
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		tx, _ := sqlstore.PgxTx(ctx)
		_, err := tx.Exec(ctx, "INSERT INTO "+orders+" (id) VALUES (2)")
		send(t, ctx, s, "k", "w")
		return err
	}))
	require.Equal(t, 1, countRows(t, s, s.Config().Table))
}
