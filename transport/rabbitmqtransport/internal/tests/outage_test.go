package tests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// The connection breaks between two calls: the call during the outage fails without
// claiming anything was sent, and the transport dials again once the broker is back.
// Every message reported sent is in the queue.
func TestReconnectAfterBrokenConnection(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("reconnect")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	p := newProxy(t)
	tr := newTransport(t, p.Addr(), rabbitmqtransport.Config{})

	first := envelope(t, topic, []byte("k"), []byte("1"))
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{first}))

	p.Cut()
	during := envelope(t, topic, []byte("k"), []byte("2"))
	err := tr.Publish(context.Background(), []*driver.Envelope{during})
	require.Error(t, err, "nothing reaches a cut broker")
	var pe *driver.PublishError
	if errors.As(err, &pe) {
		for _, f := range pe.Failed {
			assert.False(t, driver.IsPermanent(f.Err), "a broken connection is transient: %v", f.Err)
		}
	}

	p.Restore()
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{during}), "the transport redials")
	got := a.read(t, topic, 2)
	assert.Equal(t, first.ID, got[0].ID)
	assert.Equal(t, during.ID, got[1].ID)
}

const relayBuckets = 8

// TestDispatcherSurvivesBrokerOutage drives a real dispatcher over a memory store and
// the transport, connected through a TCP proxy. The proxy cuts every connection while
// messages are being relayed and refuses new ones for a while, then lets them through
// again. MaxAttempts is small, so a relay that parked what it could not deliver while
// cut off would park here: nothing may be parked, every message arrives, and the
// first deliveries of each key keep their commit order.
func TestDispatcherSurvivesBrokerOutage(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("outage")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	p := newProxy(t)
	tr := newTransport(t, p.Addr(), rabbitmqtransport.Config{ConfirmTimeout: 2 * time.Second, Route: func(env *driver.Envelope) (string, string) { return env.Topic, "" }})

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

	// Cut once the relay is under way, and keep writing meanwhile.
	waitFor(t, "the relay to publish", func() bool { return d.Stats().Published > 0 })
	p.Cut()
	cutAt := time.Now()
	enqueue(300, 300)
	// Hold the outage until the relay has failed well past MaxAttempts, and past a
	// lease, so it steps aside, whatever the machine's speed.
	retried := d.Stats().Retried
	waitFor(t, "the relay to fail during the outage", func() bool {
		return d.Stats().Retried >= retried+10 && time.Since(cutAt) > 4*time.Second
	})
	p.Restore()

	var all []rabbitmqtransport.Delivery
	seen := map[uuid.UUID]bool{}
	deadline := time.Now().Add(60 * time.Second)
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

// waitFor polls cond until it holds, failing after a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
		time.Sleep(10 * time.Millisecond)
	}
}
