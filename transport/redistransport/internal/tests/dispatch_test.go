package tests

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/redistransport"
)

const e2eBuckets = 8

func newRelay(t *testing.T, tr driver.Transport) (*memstore.Store, *relay.Relay) {
	t.Helper()
	store, err := memstore.New(memstore.Config{BucketCount: e2eBuckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	d, err := relay.New(store, tr, relay.Config{
		RelayID:      "relay-" + t.Name(),
		BucketCount:  e2eBuckets,
		BatchSize:    50,
		PollInterval: 10 * time.Millisecond,
		BackoffBase:  time.Millisecond,
		BackoffMax:   50 * time.Millisecond,
		MaxAttempts:  1000,
		Jitter:       -1,
		Logger:       slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	return store, d
}

// enqueueKeyed writes n messages over keys keys, one at a time so that each key's
// messages commit in order; the payload is "key/seq".
func enqueueKeyed(t *testing.T, store *memstore.Store, topic string, first, n, keys int, sent map[uuid.UUID]*driver.Envelope) {
	t.Helper()
	for i := first; i < first+n; i++ {
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
}

// readAll reads until every sent message arrived at least once (seen records what
// earlier calls read) and returns what it read, in stream order.
func readAll(t *testing.T, r *reader, sent map[uuid.UUID]*driver.Envelope, seen map[uuid.UUID]bool) []redistransport.Delivery {
	t.Helper()
	var all []redistransport.Delivery
	deadline := time.Now().Add(2 * time.Minute)
	for len(seen) < len(sent) {
		require.True(t, time.Now().Before(deadline), "only %d of %d messages arrived", len(seen), len(sent))
		for _, d := range r.some(t, 100) {
			require.Contains(t, sent, d.ID, "unexpected message")
			seen[d.ID] = true
			all = append(all, d)
		}
	}
	return all
}

// checkFirstDeliveryOrder asserts that the first copy of each key's messages came in
// commit order; later copies are duplicates, allowed (at least once).
func checkFirstDeliveryOrder(t *testing.T, all []redistransport.Delivery) {
	t.Helper()
	first := map[uuid.UUID]bool{}
	next := map[string]int{}
	for _, d := range all {
		if first[d.ID] {
			continue
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

// TestDispatcherSurvivesBrokerOutage drives a real dispatcher through a connection
// that a proxy cuts and later restores: messages written before, during and after the
// outage all reach the stream, nothing is parked, and each key's first deliveries keep
// commit order.
func TestDispatcherSurvivesBrokerOutage(t *testing.T) {
	t.Parallel()
	direct := connect(t, redisAddr())
	stream := streamKey(t, direct, "e2e")
	p := newProxy(t, redisAddr())
	client := connect(t, p.Addr(), func(o *redis.Options) { o.MaxRetries = 0 }) // the client's default retries
	tr := newTransport(t, client, redistransport.Config{})
	store, d := newRelay(t, tr)
	r := newReader(direct, stream)
	sent, seen := map[uuid.UUID]*driver.Envelope{}, map[uuid.UUID]bool{}

	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		assert.NoError(t, d.Stop(ctx))
	})
	enqueueKeyed(t, store, stream, 0, 200, 10, sent)
	all := readAll(t, r, sent, seen)

	p.Cut()
	retried := d.Stats().Retried
	enqueueKeyed(t, store, stream, 200, 200, 10, sent)
	// Every attempt fails while the connection is cut: wait for a few per bucket.
	require.Eventually(t, func() bool { return d.Stats().Retried >= retried+3*e2eBuckets }, 2*time.Minute, 10*time.Millisecond,
		"the relay kept trying to publish during the outage, and failing")
	p.Restore()

	enqueueKeyed(t, store, stream, 400, 200, 10, sent)
	all = append(all, readAll(t, r, sent, seen)...)

	stats := d.Stats()
	assert.Zero(t, stats.Parked, "nothing parked")
	assert.Zero(t, stats.OutOfOrder)
	checkFirstDeliveryOrder(t, all)
	t.Logf("published %d, retried %d, entries %d for %d sent", stats.Published, stats.Retried, length(t, direct, stream), len(sent))
}
