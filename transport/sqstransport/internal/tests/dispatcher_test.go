package tests

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

const e2eBuckets = 4

// enqueueSpread writes n envelopes over keys (and some keyless ones) in one order the
// test remembers per key.
func enqueueSpread(t *testing.T, store *memstore.Store, topic string, n int, keys []string) map[string][]string {
	t.Helper()
	want := map[string][]string{}
	envs := make([]*driver.Envelope, 0, n)
	for i := range n {
		var key []byte
		if i%7 != 6 {
			key = []byte(keys[i%len(keys)])
		}
		env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: key, Payload: fmt.Appendf(nil, "payload-%d", i)}, e2eBuckets)
		require.NoError(t, err)
		envs = append(envs, env)
		if key != nil {
			want[string(key)] = append(want[string(key)], env.ID.String())
		}
	}
	require.NoError(t, store.Driver().Enqueue(context.Background(), envs...))
	return want
}

// requireFirstDeliveriesInOrder reads n distinct messages from the queue and checks
// that, per key, first deliveries follow the enqueue order.
func requireFirstDeliveriesInOrder(t *testing.T, srv *emulator.Server, url string, n int, want map[string][]string) {
	t.Helper()
	seen := map[string]bool{}
	got := map[string][]string{}
	for len(seen) < n {
		batch, _ := receive(t, srv.Client(), url, 1)
		for _, d := range batch {
			id := d.ID.String()
			if seen[id] {
				continue
			}
			seen[id] = true
			if d.Key != nil {
				got[string(d.Key)] = append(got[string(d.Key)], id)
			}
		}
	}
	require.Len(t, seen, n)
	for key, ids := range want {
		require.Equal(t, ids, got[key], "first deliveries of key %q in commit order", key)
	}
}

func pendingCount(t *testing.T, store *memstore.Store) int {
	t.Helper()
	stats, err := store.Driver().(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	total := 0
	for _, p := range stats.Pending {
		total += p
	}
	return total
}

// The dispatcher relays a backlog through the SQS transport to a FIFO queue while
// publishes fail at random: every message arrives, and per key the first deliveries
// keep commit order.
func TestDispatcherToFIFOUnderFaults(t *testing.T) {
	t.Parallel()
	srv, _, url := setup(t, true, nil)
	store, err := memstore.New(memstore.Config{BucketCount: e2eBuckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })

	tr := newTransport(t, srv.Client(), sqstransport.Config{Resolver: sqstransport.Queues{"orders": url}})
	faulty, err := outboxtest.NewFaultTransport(tr, outboxtest.Faults{MessageErrorRate: 0.2, BatchErrorRate: 0.1, Seed: 7})
	require.NoError(t, err)
	d, err := relay.New(store, faulty, relay.Config{
		RelayID:     "sqs-e2e",
		BucketCount: e2eBuckets,
		BatchSize:   25,
		BackoffBase: time.Millisecond,
		BackoffMax:  2 * time.Millisecond,
		Jitter:      -1,
		MaxAttempts: 1000,
		Logger:      slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)

	const n = 240
	want := enqueueSpread(t, store, "orders", n, []string{"alice", "bob", "carol dee", "\x00binary", "dave"})

	ctx := context.Background()
	for round := 0; pendingCount(t, store) > 0; round++ {
		require.Less(t, round, 500, "the backlog drains")
		_, err := d.RunOnce(ctx)
		require.NoError(t, err)
		time.Sleep(3 * time.Millisecond) // let the backoff pass
	}
	require.Positive(t, faulty.Injected(), "faults were injected")
	requireFirstDeliveriesInOrder(t, srv, url, n, want)
}

// A long-running dispatcher that sends a key's messages together (the transport is
// declared an driver.KeyOrderKeeper): the FIFO transport keeps one message per key in
// each request and holds back a failed key's tail, so per-key order holds.
func TestDispatcherWorkerToFIFOSendsAKeysMessagesTogether(t *testing.T) {
	t.Parallel()
	srv, _, url := setup(t, true, nil)
	store, err := memstore.New(memstore.Config{BucketCount: e2eBuckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })

	tr := newTransport(t, srv.Client(), sqstransport.Config{Resolver: sqstransport.Queues{"orders": url}})
	d, err := relay.New(store, fifoKeepsKeyOrder{tr}, relay.Config{
		RelayID:      "sqs-worker",
		BucketCount:  e2eBuckets,
		PollInterval: 10 * time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, d.Start(ctx))
	const n = 150
	want := enqueueSpread(t, store, "orders", n, []string{"k1", "k2", "k3"})
	requireFirstDeliveriesInOrder(t, srv, url, n, want)
	require.NoError(t, d.Stop(ctx))
	<-d.Stopped()
	require.Zero(t, pendingCount(t, store))
}

// fifoKeepsKeyOrder declares what the transport does on FIFO queues: it never
// acknowledges a key's message after failing an earlier one in the same call.
type fifoKeepsKeyOrder struct{ driver.Transport }

func (fifoKeepsKeyOrder) KeepsKeyOrder() bool { return true }
