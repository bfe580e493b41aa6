package tests

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/netfault"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// proxiedPool is a pgx pool that reaches PostgreSQL through p.
func proxiedPool(t *testing.T) (*pgxpool.Pool, *netfault.Proxy) {
	postgresPool(t) // skips (or fails under CI) without a server
	u, err := url.Parse(postgresURL())
	require.NoError(t, err)
	p := netfault.New(t, u.Host)
	u.Host = p.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, p
}

// A relay whose PostgreSQL connections are black-holed (held open, nothing
// forwarded, no reset) is not wedged: every store call hits its deadline, the pool
// opens new connections, and the relay publishes what was committed meanwhile.
// Without deadlines the calls would wait on the holed connections for good.
func TestBlackHoledConnectionsHitTheirDeadline(t *testing.T) {
	t.Parallel()
	pool, p := proxiedPool(t)
	direct := pgxBackend().open(t, sqlstore.Config{BucketCount: 2})
	viaProxy, err := sqlstore.NewPgx(pool, sqlstore.Config{BucketCount: 2, Table: direct.Config().Table, Logger: quietLog})
	require.NoError(t, err)
	t.Cleanup(func() { _ = viaProxy.Close() })
	rec := outboxtest.NewRecorder()
	d, err := relay.New(viaProxy, rec, relay.Config{RelayID: "a", PollInterval: 50 * time.Millisecond,
		LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second, Logger: quietLog})
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(d.Kill)

	require.NoError(t, drv(direct).Enqueue(testContext(t), newEnvelope(t, direct, "k", "before")))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, rec.WaitForUnique(ctx, 1))

	p.Blackhole()
	for i := range 20 {
		require.NoError(t, drv(direct).Enqueue(testContext(t), newEnvelope(t, direct, fmt.Sprintf("k%d", i%3), fmt.Sprintf("during-%d", i))))
	}
	require.NoError(t, rec.WaitForUnique(ctx, 21), "the relay recovers on new connections")
	require.NoError(t, d.Err())
}

// A graceful stop refuses no write with every statement delayed on the network: the
// case where releases one write at a time let peers plan conflicting claims (six
// buckets, three relays).
func TestGracefulStopUnderLatencyRefusesNothing(t *testing.T) {
	t.Parallel()
	pool, p := proxiedPool(t)
	direct := pgxBackend().open(t, sqlstore.Config{BucketCount: 6})
	p.SetLatency(3 * time.Millisecond)
	relays := map[string]*relay.Relay{}
	for _, id := range []string{"a", "b", "c"} {
		s, err := sqlstore.NewPgx(pool, sqlstore.Config{BucketCount: 6, Table: direct.Config().Table, Logger: quietLog})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		d, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: id, PollInterval: 200 * time.Millisecond,
			LeaseDuration: 5 * time.Minute, LeaseRenewInterval: 100 * time.Second, Logger: quietLog})
		require.NoError(t, err)
		require.NoError(t, d.Start(context.Background()))
		t.Cleanup(d.Kill)
		relays[id] = d
	}
	owned := func(want ...int) func() bool {
		return func() bool {
			for i, id := range []string{"a", "b", "c"}[:len(want)] {
				if len(relays[id].Owned()) != want[i] {
					return false
				}
			}
			return true
		}
	}
	refused := func() (n int64) {
		for _, d := range relays {
			n += d.Stats().RefusedWrites
		}
		return n
	}
	waitUntil(t, "the fleet splits 2/2/2", owned(2, 2, 2))
	before := refused()
	require.NoError(t, relays["c"].Stop(context.Background()))
	waitUntil(t, "a and b hold 3 each", owned(3, 3))
	require.Equal(t, before, refused(), "a graceful stop refuses nothing")
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		require.True(t, time.Now().Before(deadline), what)
		time.Sleep(10 * time.Millisecond)
	}
}
