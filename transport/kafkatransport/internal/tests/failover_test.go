package tests

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// Two relays share a store; relay a reaches Kafka through a proxy that then
// black-holes it, relay b directly. Relay a's publishes fail and its pings too, so
// it hands its buckets to b, which publishes everything; a parks nothing although
// its attempts run out, and takes its share back once its broker answers again.
func TestRelayCutOffFromKafkaHandsItsBucketsToAPeer(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 4, "failover")
	p := newProxy(t, c)
	cutClient, err := kgo.NewClient(p.clientOpts(c)...)
	require.NoError(t, err)
	t.Cleanup(cutClient.Close)
	cutTr, err := kafkatransport.New(cutClient, kafkatransport.Config{AckTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	goodTr := newTransport(t, c, kafkatransport.Config{})

	store, err := memstore.New(memstore.Config{BucketCount: e2eBuckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	relay := func(id string, tr *kafkatransport.Transport) *relay.Relay {
		d, err := relay.New(store, tr, relay.Config{RelayID: id, PollInterval: 50 * time.Millisecond,
			LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second, MaxAttempts: 2,
			BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		require.NoError(t, d.Start(context.Background()))
		t.Cleanup(d.Kill)
		return d
	}
	a, b := relay("a", cutTr), relay("b", goodTr)
	waitUntil := func(what string, cond func() bool) time.Duration {
		start := time.Now()
		for !cond() {
			require.Less(t, time.Since(start), 2*time.Minute, what)
			time.Sleep(10 * time.Millisecond)
		}
		return time.Since(start)
	}
	waitUntil("the fleet splits", func() bool { return len(a.Owned()) == e2eBuckets/2 && len(b.Owned()) == e2eBuckets/2 })

	p.blackhole()
	start := time.Now()
	sent := enqueueKeyed(t, store, "failover", 40, 8)
	cs := newConsumer(t, c, "failover")
	seen := map[uuid.UUID]bool{}
	for len(seen) < len(sent) {
		for _, d := range decodeAll(t, cs.read(t, 1)) {
			seen[d.ID] = true
		}
		require.Less(t, time.Since(start), 2*time.Minute, "every message reaches Kafka through the peer")
	}
	t.Logf("black hole to every message on Kafka: %s (LeaseDuration 3 s)", time.Since(start))
	require.Zero(t, a.Stats().Parked+b.Stats().Parked, "nothing parked")
	require.Empty(t, a.Owned(), "the cut-off relay holds nothing")

	p.heal()
	waitUntil("a takes its share back", func() bool { return len(a.Owned()) == e2eBuckets/2 && len(b.Owned()) == e2eBuckets/2 })
	require.NoError(t, a.Err())
}
