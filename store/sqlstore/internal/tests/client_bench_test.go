package tests

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// relayClient is one way to give the store a PostgreSQL client.
type relayClient struct {
	name string
	// open returns a store on fresh tables and, for database/sql with its own
	// connections, the *sql.DB whose reconnects are counted.
	open func(b *testing.B) (*sqlstore.Store, *sql.DB)
}

// relayClients are the clients BenchmarkRelayClient compares: pgx's pool, and
// database/sql through pgx's stdlib driver with its default idle limit (2), with
// room for 10 idle connections (what NewDB advises), and on top of a pgx pool
// (stdlib.OpenDBFromPool). Every pool may open 16 connections.
func relayClients() []relayClient {
	onDB := func(b *testing.B, db *sql.DB) (*sqlstore.Store, *sql.DB) {
		s, err := sqlstore.NewDB(db, sqlstore.PostgreSQL, withTable(sqlstore.Config{Logger: quietLog}))
		return migrated(b, s, err), db
	}
	openDB := func(b *testing.B) *sql.DB {
		db, err := sql.Open("pgx", postgresURL())
		require.NoError(b, err)
		b.Cleanup(func() { _ = db.Close() })
		db.SetMaxOpenConns(16)
		return db
	}
	return []relayClient{
		{"pgx", func(b *testing.B) (*sqlstore.Store, *sql.DB) {
			s, err := sqlstore.NewPgx(postgresPool(b), withTable(sqlstore.Config{Logger: quietLog}))
			return migrated(b, s, err), nil
		}},
		{"sql", func(b *testing.B) (*sqlstore.Store, *sql.DB) { return onDB(b, openDB(b)) }},
		{"sql-idle10", func(b *testing.B) (*sqlstore.Store, *sql.DB) {
			db := openDB(b)
			db.SetMaxIdleConns(10)
			return onDB(b, db)
		}},
		{"sql-frompool", func(b *testing.B) (*sqlstore.Store, *sql.DB) {
			// Its closes hand connections back to the pgx pool: nothing to count.
			db := stdlib.OpenDBFromPool(postgresPool(b))
			b.Cleanup(func() { _ = db.Close() })
			s, _ := onDB(b, db)
			return s, nil
		}},
	}
}

// brokerSwitch refuses every publish while down, as a broker in an outage does.
type brokerSwitch struct {
	down atomic.Bool
	rec  *outboxtest.Recorder
}

func (s *brokerSwitch) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if s.down.Load() {
		return outboxtest.ErrOutage
	}
	return s.rec.Publish(ctx, batch)
}

// BenchmarkRelayClient compares the relay on the same PostgreSQL server through pgx
// and through database/sql (pgx's stdlib driver) in three ways of configuring it
// (see relayClients). Every iteration runs each client once, in rotating order, so
// they share the machine's state:
//
//   - drain: one RunOnce empties a backlog of 10,000 (Fetch, Publish, Complete);
//     "<client>-msg/s".
//   - outage: one RunOnce against a broker that refuses everything: a Fetch and a
//     Reschedule per message of each bucket's head; "<client>-msg/s".
//   - recover: two running relays hold a backlog of 20,000 through a one-second broker
//     outage; "<client>-s-30%" and "<client>-s-all" are the times from the broker's
//     return until 30 % and all of it was published.
//
// "<client>-reconnects" counts the connections database/sql closed for want of idle
// room, per run.
func BenchmarkRelayClient(b *testing.B) {
	b.Run("drain", func(b *testing.B) { benchRelayClients(b, runDrain(10_000, false)) })
	b.Run("outage", func(b *testing.B) { benchRelayClients(b, runDrain(2_000, true)) })
	b.Run("recover", func(b *testing.B) { benchRelayClients(b, runRecover(20_000)) })
}

// clientRun runs one scenario on s and returns its metrics.
type clientRun func(b *testing.B, s *sqlstore.Store) map[string]float64

func benchRelayClients(b *testing.B, run clientRun) {
	clients := relayClients()
	stores := make([]*sqlstore.Store, len(clients))
	dbs := make([]*sql.DB, len(clients))
	for i, c := range clients {
		stores[i], dbs[i] = c.open(b)
	}
	sums := map[string]float64{}
	n := 0
	for b.Loop() {
		for k := range clients {
			i := (n + k) % len(clients)
			var before sql.DBStats
			if dbs[i] != nil {
				before = dbs[i].Stats()
			}
			for metric, v := range run(b, stores[i]) {
				sums[clients[i].name+"-"+metric] += v
			}
			if dbs[i] != nil {
				sums[clients[i].name+"-reconnects"] += float64(dbs[i].Stats().MaxIdleClosed - before.MaxIdleClosed)
			}
		}
		n++
	}
	for metric, v := range sums {
		b.ReportMetric(v/float64(n), metric)
	}
}

// runDrain fills a backlog and times one RunOnce over it, against a broker that
// takes everything or, with down, refuses everything.
func runDrain(backlog int, down bool) clientRun {
	return func(b *testing.B, s *sqlstore.Store) map[string]float64 {
		ctx := context.Background()
		b.StopTimer()
		defer b.StartTimer()
		fill(b, ctx, s, backlog, randomPayload(256))
		defer truncate(b, s)
		tr := &brokerSwitch{rec: outboxtest.NewRecorder()}
		tr.down.Store(down)
		d, err := relay.New(s, tr, relay.Config{BucketCount: s.Config().BucketCount, RelayID: "bench", Logger: quietLog,
			BackoffBase: time.Hour, BackoffMax: time.Hour})
		require.NoError(b, err)
		b.StartTimer()
		start := time.Now()
		res, err := d.RunOnce(ctx)
		elapsed := time.Since(start)
		b.StopTimer()
		require.NoError(b, err)
		handled := res.Published
		if down {
			handled = res.Retried // each bucket's head batch, rescheduled
			require.Positive(b, handled)
		} else {
			require.Equal(b, backlog, handled)
		}
		return map[string]float64{"msg/s": float64(handled) / elapsed.Seconds()}
	}
}

// runRecover starts two relays on a backlog, keeps the broker down for a second once
// they hold every bucket, and times the drain after it returns.
func runRecover(backlog int) clientRun {
	return func(b *testing.B, s *sqlstore.Store) map[string]float64 {
		ctx := context.Background()
		b.StopTimer()
		defer b.StartTimer()
		fill(b, ctx, s, backlog, randomPayload(256))
		defer truncate(b, s)
		tr := &brokerSwitch{rec: outboxtest.NewRecorder()}
		tr.down.Store(true)
		var relays []*relay.Relay
		for i := range 2 {
			d, err := relay.New(s, tr, relay.Config{BucketCount: s.Config().BucketCount, RelayID: fmt.Sprintf("bench-%d", i),
				Logger: quietLog, PollInterval: 100 * time.Millisecond, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second,
				LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second})
			require.NoError(b, err)
			require.NoError(b, d.Start(ctx))
			relays = append(relays, d)
		}
		defer func() {
			for _, d := range relays {
				require.NoError(b, d.Stop(ctx))
			}
		}()
		owned := func() int {
			n := 0
			for _, d := range relays {
				n += len(d.Owned())
			}
			return n
		}
		// Generous: leases are claimed within a round or two; the bound only ends a
		// run that cannot work.
		require.Eventually(b, func() bool { return owned() == s.Config().BucketCount }, time.Minute, 10*time.Millisecond)
		time.Sleep(time.Second)
		tr.down.Store(false)
		up := time.Now()
		var to30 time.Duration
		for tr.rec.Unique() < backlog {
			if to30 == 0 && tr.rec.Unique() >= backlog*3/10 {
				to30 = time.Since(up)
			}
			require.Less(b, time.Since(up), 5*time.Minute, "the backlog did not drain")
			time.Sleep(2 * time.Millisecond)
		}
		toAll := time.Since(up)
		if to30 == 0 {
			to30 = toAll
		}
		return map[string]float64{"s-30%": to30.Seconds(), "s-all": toAll.Seconds()}
	}
}

// truncate empties a store's messages table between runs.
func truncate(b *testing.B, s *sqlstore.Store) {
	_, err := postgresPool(b).Exec(context.Background(), "TRUNCATE "+s.Config().Table)
	require.NoError(b, err)
}
