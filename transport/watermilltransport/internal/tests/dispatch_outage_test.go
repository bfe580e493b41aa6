//go:build !race

// Watermill's AMQP adapter (watermill-amqp v3.0.2) reassigns the channel behind
// ConnectionWrapper.IsConnected from its reconnection goroutine without
// synchronisation, while every Publish reads it: the race detector reports that data
// race inside the adapter during any outage, whatever the caller does. So this test
// runs in builds without -race only: go test -count=1 ./internal/tests/
// (in this module).

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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

const relayBuckets = 8

// TestDispatcherSurvivesBrokerOutage drives a real dispatcher over a memory store and
// Watermill's AMQP publisher, connected through a TCP proxy that cuts every connection
// while messages are relayed, refuses new ones for a while, then lets them through.
// Watermill's publisher reconnects by itself; Config.Ping reports its connection
// state. MaxAttempts is small, so a relay that parked what it could not deliver while
// cut off would park here: nothing may be parked, every message arrives, and the first
// deliveries of each key keep their commit order.
func TestDispatcherSurvivesBrokerOutage(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("outage")
	a.queue(t, topic, nil)
	p := newProxy(t)
	tr := newTransport(t, publisher(t, p.Addr()), watermilltransport.Config{})

	store, err := memstore.New(memstore.Config{BucketCount: relayBuckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	d, err := relay.New(store, tr, relay.Config{
		RelayID:            "relay-" + t.Name(),
		BucketCount:        relayBuckets,
		BatchSize:          50,
		PollInterval:       10 * time.Millisecond,
		LeaseDuration:      3 * time.Second,
		LeaseRenewInterval: time.Second,
		BackoffBase:        time.Millisecond,
		BackoffMax:         20 * time.Millisecond,
		MaxAttempts:        3,
		Jitter:             -1,
		Logger:             slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)

	sent := map[uuid.UUID]bool{}
	enqueue := func(from, n int) {
		for i := from; i < from+n; i++ {
			key := fmt.Sprintf("key-%d", i%10)
			env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: []byte(key), Payload: fmt.Appendf(nil, "%s/%d", key, i/10)}, relayBuckets)
			require.NoError(t, err)
			require.NoError(t, store.Driver().Enqueue(context.Background(), env))
			sent[env.ID] = true
		}
	}
	enqueue(0, 300)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Stop(ctx)
	})

	waitFor(t, "the relay to publish", func() bool { return d.Stats().Published > 0 })
	p.Cut()
	cutAt := time.Now()
	enqueue(300, 300)
	retried := d.Stats().Retried
	waitFor(t, "the relay to fail during the outage", func() bool {
		return d.Stats().Retried >= retried+10 && time.Since(cutAt) > 4*time.Second
	})
	p.Restore()

	var all []watermilltransport.Delivery
	seen := map[uuid.UUID]bool{}
	deadline := time.Now().Add(90 * time.Second)
	for len(seen) < len(sent) {
		require.True(t, time.Now().Before(deadline), "only %d of %d messages arrived", len(seen), len(sent))
		for _, dl := range a.read(t, topic, 1) {
			require.True(t, sent[dl.ID], "unexpected message %s", dl.ID)
			seen[dl.ID] = true
			all = append(all, dl)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, d.Stop(ctx))

	stats := d.Stats()
	assert.Zero(t, stats.Parked, "nothing is parked for an outage")
	parked, err := store.Driver().(driver.Admin).List(context.Background(), driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	assert.Empty(t, parked)
	assert.Positive(t, stats.Retried, "the outage forced retries")
	assert.Zero(t, stats.OutOfOrder)

	first := map[uuid.UUID]bool{}
	next := map[string]int{}
	for _, dl := range all {
		if first[dl.ID] {
			continue // a duplicate: at least once
		}
		first[dl.ID] = true
		key, seqText, ok := strings.Cut(string(dl.Payload), "/")
		require.True(t, ok)
		seq, err := strconv.Atoi(seqText)
		require.NoError(t, err)
		require.Equal(t, next[key], seq, "first deliveries of %s out of order", key)
		next[key]++
	}
	t.Logf("published %d, retried %d, deliveries %d (duplicates %d)", stats.Published, stats.Retried, len(all), len(all)-len(sent))
}
