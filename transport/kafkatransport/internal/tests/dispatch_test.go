package tests

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

const e2eBuckets = 8

// newRelay builds a memory store and a dispatcher that publishes through tr with
// fast retries.
func newRelay(t *testing.T, tr driver.Transport, tune func(*relay.Config)) (*memstore.Store, *relay.Relay) {
	t.Helper()
	store, err := memstore.New(memstore.Config{BucketCount: e2eBuckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	cfg := relay.Config{
		RelayID:      "relay-" + t.Name(),
		BucketCount:  e2eBuckets,
		BatchSize:    50,
		PollInterval: 10 * time.Millisecond,
		BackoffBase:  time.Millisecond,
		BackoffMax:   20 * time.Millisecond,
		MaxAttempts:  1000,
		Jitter:       -1,
		Logger:       slog.New(slog.DiscardHandler),
	}
	if tune != nil {
		tune(&cfg)
	}
	d, err := relay.New(store, tr, cfg)
	require.NoError(t, err)
	return store, d
}

// enqueueKeyed writes n messages over keys keys, one at a time so that each key's
// messages are committed in order; the payload is "key/seq".
func enqueueKeyed(t *testing.T, store *memstore.Store, topic string, n, keys int) map[uuid.UUID]*driver.Envelope {
	t.Helper()
	sent := map[uuid.UUID]*driver.Envelope{}
	for i := range n {
		key := fmt.Sprintf("key-%d", i%keys)
		env, err := driver.NewEnvelope(outbox.Message{
			Topic:   topic,
			Key:     []byte(key),
			Payload: fmt.Appendf(nil, "%s/%d", key, i/keys),
		}, e2eBuckets)
		require.NoError(t, err)
		require.NoError(t, store.Driver().Enqueue(context.Background(), env))
		sent[env.ID] = env
	}
	return sent
}

// readUntilAll consumes topic until every sent id arrived at least once and returns
// everything read, in per-partition order.
func readUntilAll(t *testing.T, cs *consumer, sent map[uuid.UUID]*driver.Envelope) []kafkatransport.Delivery {
	t.Helper()
	seen := map[uuid.UUID]bool{}
	var all []kafkatransport.Delivery
	deadline := time.Now().Add(30 * time.Second)
	for len(seen) < len(sent) {
		require.True(t, time.Now().Before(deadline), "only %d of %d messages arrived", len(seen), len(sent))
		for _, d := range decodeAll(t, cs.read(t, 1)) {
			require.Contains(t, sent, d.ID, "unexpected message")
			seen[d.ID] = true
			all = append(all, d)
		}
	}
	return all
}

// checkFirstDeliveryOrder asserts that each key stayed on its bucket's partition and
// that the first delivery of each message came in the order the key's messages were
// written.
func checkFirstDeliveryOrder(t *testing.T, all []kafkatransport.Delivery, sent map[uuid.UUID]*driver.Envelope) {
	t.Helper()
	first := map[uuid.UUID]bool{}
	next := map[string]int{} // key -> next expected seq
	for _, d := range all {
		env := sent[d.ID]
		assert.Equal(t, int32(env.Bucket), *d.Partition, "key %s left its partition", env.Key)
		if first[d.ID] {
			continue // a duplicate: allowed, at least once
		}
		first[d.ID] = true
		key, seqText, ok := strings.Cut(string(d.Payload), "/")
		require.True(t, ok)
		seq, err := strconv.Atoi(seqText)
		require.NoError(t, err)
		require.Equal(t, next[key], seq, "first deliveries of %s out of order", key)
		next[key]++
	}
}

// TestDispatcherDeliversInKeyOrderThroughRefusedProduceRequests runs the worker over
// a memory store and the transport while the cluster itself refuses some produce
// requests (NotLeaderForPartition, with the client's retries off): every message
// arrives at least once and the first deliveries of each key keep their commit order
// within its partition, whether the relay sends a key's messages together (the
// transport's driver.KeyOrderKeeper promise, kept by failing a partition's whole
// tail) or, with that promise hidden, one per call. The relay suite (relay_test.go)
// injects its faults above the transport; only kfake refuses inside the broker, so
// this is the test of how the transport reports a refusal to the relay.
func TestDispatcherDeliversInKeyOrderThroughRefusedProduceRequests(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		keys      int
		refuseNth int64
		hide      bool
	}{
		{"KeysTogether", 20, 3, false},
		{"OneMessagePerKeyPerPublish", 5, 4, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, e2eBuckets, "e2e")
			var produces atomic.Int64
			c.Fault(kfake.Fault{
				Keys: []kmsg.Key{kmsg.Produce}, Topic: "e2e", Err: kerr.NotLeaderForPartition, Count: -1,
				When: func(kmsg.Request) bool { return produces.Add(1)%tc.refuseNth == 0 },
			})
			// No retries inside the client: a refused request fails its records, so
			// the dispatcher's retries and ordering are what is under test.
			var tr driver.Transport = newTransport(t, c, kafkatransport.Config{}, kgo.RecordRetries(0), kgo.MetadataMinAge(10*time.Millisecond))
			if tc.hide {
				tr = struct{ driver.Transport }{tr}
			}
			store, d := newRelay(t, tr, nil)
			sent := enqueueKeyed(t, store, "e2e", 400, tc.keys)

			require.NoError(t, d.Start(context.Background()))
			all := readUntilAll(t, newConsumer(t, c, "e2e"), sent)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, d.Stop(ctx))

			checkFirstDeliveryOrder(t, all, sent)
			stats := d.Stats()
			assert.Positive(t, stats.Retried, "the faults should have forced retries")
			assert.Zero(t, stats.Parked)
			assert.Zero(t, stats.OutOfOrder)
			t.Logf("published %d, retried %d, records read %d", stats.Published, stats.Retried, len(all))
		})
	}
}

// TestDispatcherParksOversizedMessageAtOnce: a message over the transport's limit
// fails permanently and is parked on its first attempt; its key's later message still
// goes out.
func TestDispatcherParksOversizedMessageAtOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t, e2eBuckets, "e2e-big")
	tr := newTransport(t, c, kafkatransport.Config{MaxMessageSize: 1024})
	store, d := newRelay(t, tr, func(cfg *relay.Config) { cfg.MaxAttempts = 10 })

	var batch []*driver.Envelope
	for _, size := range []int{10, 2048, 10} {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "e2e-big", Key: []byte("k"), Payload: make([]byte, size)}, e2eBuckets)
		require.NoError(t, err)
		batch = append(batch, env)
	}
	require.NoError(t, store.Driver().Enqueue(context.Background(), batch...))

	for range 10 {
		if _, err := d.RunOnce(context.Background()); err != nil {
			require.NoError(t, err)
		}
		if stats := d.Stats(); stats.Published == 2 {
			break
		}
	}
	stats := d.Stats()
	assert.Equal(t, int64(2), stats.Published)
	assert.Equal(t, int64(1), stats.Parked)
	assert.Zero(t, stats.Retried, "a permanent failure is not retried")

	parked, err := store.Driver().(driver.Admin).List(context.Background(), driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, batch[1].ID, parked[0].ID)
	assert.Contains(t, parked[0].LastError, "exceeds")

	got := decodeAll(t, newConsumer(t, c, "e2e-big").readAll(t, 2))
	require.Len(t, got, 2)
	assert.Equal(t, batch[0].ID, got[0].ID)
	assert.Equal(t, batch[2].ID, got[1].ID)
}
