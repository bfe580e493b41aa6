package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// The default route publishes to the exchange named by the topic with the key as the
// routing key; a Route to another exchange stamps the topic, so Decode still names it.
func TestDefaultRoute(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("route")
	a.exchange(t, topic, amqp.ExchangeDirect)
	a.queue(t, topic+"-a", topic, "a", nil)
	a.queue(t, topic+"-b", topic, "b", nil)
	tr := newTransport(t, "", rabbitmqtransport.Config{})

	ea := envelope(t, topic, []byte("a"), []byte("to a"))
	eb := envelope(t, topic, []byte("b"), []byte("to b"))
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{ea, eb}))
	got := a.read(t, topic+"-a", 1)[0]
	assert.Equal(t, ea.ID, got.ID)
	assert.Equal(t, topic, got.Topic)
	assert.Equal(t, topic, got.Exchange)
	assert.Equal(t, "a", got.RoutingKey)
	assert.Equal(t, "to a", string(got.Payload))
	assert.Equal(t, eb.ID, a.read(t, topic+"-b", 1)[0].ID)

	// Another exchange: the topic travels in a header.
	other := uniqueName("other")
	a.exchange(t, other, amqp.ExchangeFanout)
	a.queue(t, other, other, "", nil)
	routed := newTransport(t, "", rabbitmqtransport.Config{Route: func(*driver.Envelope) (string, string) { return other, "" }})
	env := envelope(t, "orders.placed", []byte("k"), []byte("p"))
	require.NoError(t, routed.Publish(context.Background(), []*driver.Envelope{env}))
	d := a.read(t, other, 1)[0]
	assert.Equal(t, "orders.placed", d.Topic)
	assert.Equal(t, other, d.Exchange)
}

// A message no queue is bound to receive is returned by the broker (mandatory) and
// fails permanently; the rest of the batch is delivered.
func TestUnroutableIsPermanent(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("unroutable")
	a.exchange(t, topic, amqp.ExchangeDirect)
	a.queue(t, topic, topic, "bound", nil)
	tr := newTransport(t, "", rabbitmqtransport.Config{})

	before := envelope(t, topic, []byte("bound"), []byte("1"))
	lost := envelope(t, topic, []byte("nobody"), []byte("2"))
	after := envelope(t, topic, []byte("bound"), []byte("3"))
	failed := outboxtest.Failures(t, tr.Publish(context.Background(), []*driver.Envelope{before, lost, after}))
	require.Len(t, failed, 1, "only the unroutable message fails: %v", failed)
	require.Contains(t, failed, lost.ID)
	assert.True(t, driver.IsPermanent(failed[lost.ID]), "unroutable is permanent: %v", failed[lost.ID])
	assert.ErrorIs(t, failed[lost.ID], outbox.ErrInvalidMessage)
	assert.ErrorContains(t, failed[lost.ID], "NO_ROUTE")

	got := a.read(t, topic, 2)
	assert.Equal(t, before.ID, got[0].ID)
	assert.Equal(t, after.ID, got[1].ID)

	// The channel is still usable: the next call publishes on it.
	next := envelope(t, topic, []byte("bound"), []byte("4"))
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{next}))
	assert.Equal(t, next.ID, a.read(t, topic, 1)[0].ID)
}

// A publish to an exchange that does not exist closes the channel (404): the messages
// for that exchange fail permanently, those the closed channel could no longer carry
// fail transiently, what was confirmed before is delivered, and the next call works
// on a fresh channel. With MissingExchangeTransient the missing exchange is transient.
func TestMissingExchange(t *testing.T) {
	t.Parallel()
	for _, transient := range []bool{false, true} {
		t.Run(fmt.Sprint("transient=", transient), func(t *testing.T) {
			t.Parallel()
			a := newAdmin(t)
			topic := uniqueName("exists")
			a.exchange(t, topic, amqp.ExchangeFanout)
			a.queue(t, topic, topic, "", nil)
			missing := uniqueName("missing")
			tr := newTransport(t, "", rabbitmqtransport.Config{MissingExchangeTransient: transient})

			first := envelope(t, topic, []byte("k"), []byte("first"))
			require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{first}), "warm the channel")
			bad := envelope(t, missing, []byte("k"), []byte("nowhere"))
			later := envelope(t, topic, []byte("k2"), []byte("later"))
			failed := outboxtest.Failures(t, tr.Publish(context.Background(), []*driver.Envelope{bad, later}))
			require.Contains(t, failed, bad.ID)
			assert.Equal(t, !transient, driver.IsPermanent(failed[bad.ID]), "missing exchange: %v", failed[bad.ID])
			assert.ErrorContains(t, failed[bad.ID], "NOT_FOUND")
			if err, ok := failed[later.ID]; ok {
				assert.False(t, driver.IsPermanent(err), "a message the closed channel lost is transient: %v", err)
			}

			retry := envelope(t, topic, []byte("k2"), []byte("retry"))
			require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{retry}), "a fresh channel after the close")
			want := map[uuid.UUID]bool{first.ID: true, retry.ID: true}
			n := 2
			if _, lost := failed[later.ID]; !lost {
				want[later.ID] = true
				n = 3
			}
			for _, d := range a.read(t, topic, n) {
				assert.True(t, want[d.ID], "unexpected message %s", d.ID)
			}
			assert.Zero(t, a.depth(t, topic))
		})
	}
}

// A queue that refuses publishes when full (x-overflow=reject-publish) makes the
// broker nack: the refused messages fail transiently, the accepted one is delivered.
func TestNackIsTransient(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("full")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	tr := newTransport(t, "", rabbitmqtransport.Config{})

	batch := []*driver.Envelope{
		envelope(t, topic, []byte("a"), []byte("1")),
		envelope(t, topic, []byte("b"), []byte("2")),
		envelope(t, topic, []byte("c"), []byte("3")),
	}
	failed := outboxtest.Failures(t, tr.Publish(context.Background(), batch))
	require.Len(t, failed, 2, "the queue holds one message: %v", failed)
	for _, env := range batch[1:] {
		require.Contains(t, failed, env.ID)
		assert.False(t, driver.IsPermanent(failed[env.ID]), "a nack is transient: %v", failed[env.ID])
		assert.ErrorContains(t, failed[env.ID], "basic.nack")
	}
	assert.Equal(t, batch[0].ID, a.read(t, topic, 1)[0].ID)
}

// A message whose headers do not fit the connection's frame is refused before it is
// sent (the broker would close the whole connection); the others go out.
func TestHeadersOverFrameSize(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("frame")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	tr := newTransport(t, "", rabbitmqtransport.Config{})
	big, err := driver.NewEnvelope(outbox.Message{Topic: topic, Payload: []byte("x"), Headers: []outbox.Header{{Key: "big", Value: make([]byte, 200<<10)}}}, driver.DefaultBucketCount)
	require.NoError(t, err)
	ok := envelope(t, topic, []byte("k"), []byte("fine"))
	failed := outboxtest.Failures(t, tr.Publish(context.Background(), []*driver.Envelope{big, ok}))
	require.Len(t, failed, 1)
	assert.ErrorIs(t, failed[big.ID], outbox.ErrTooLarge)
	assert.True(t, driver.IsPermanent(failed[big.ID]))
	assert.Equal(t, ok.ID, a.read(t, topic, 1)[0].ID)
}

// Publish calls from many goroutines share the connection, each on a channel of its
// own; every message arrives once.
func TestConcurrentPublishes(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("concurrent")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	tr := newTransport(t, "", rabbitmqtransport.Config{})
	const workers, per = 4, 50
	var wg sync.WaitGroup
	ids := make(chan uuid.UUID, workers*per)
	for w := range workers {
		wg.Go(func() {
			for i := range per / 10 {
				var batch []*driver.Envelope
				for j := range 10 {
					env := envelope(t, topic, fmt.Appendf(nil, "w%d", w), fmt.Appendf(nil, "%d", i*10+j))
					batch = append(batch, env)
					ids <- env.ID
				}
				assert.NoError(t, tr.Publish(context.Background(), batch))
			}
		})
	}
	wg.Wait()
	close(ids)
	want := map[uuid.UUID]bool{}
	for id := range ids {
		want[id] = true
	}
	seen := map[uuid.UUID]bool{}
	for _, d := range a.read(t, topic, workers*per) {
		require.True(t, want[d.ID], "unexpected %s", d.ID)
		require.False(t, seen[d.ID], "duplicate %s", d.ID)
		seen[d.ID] = true
	}
}

// As reaches the live connection, once there is one. (The relay suite's Outage/Call
// covers Ping through a cut.)
func TestAs(t *testing.T) {
	t.Parallel()
	tr := newTransport(t, "", rabbitmqtransport.Config{})
	var conn *amqp.Connection
	assert.False(t, tr.As(&conn), "no connection before the first call")
	require.NoError(t, tr.Ping(context.Background()))
	require.True(t, tr.As(&conn))
	require.False(t, conn.IsClosed())
	var other int
	assert.False(t, tr.As(&other))
}

// A dialer whose connection enables the client's own recovery is refused.
func TestClientRecoveryRefused(t *testing.T) {
	t.Parallel()
	needBroker(t)
	tr, err := rabbitmqtransport.New(func(context.Context) (*amqp.Connection, error) {
		return amqp.DialConfig(amqpURL(), amqp.Config{Recovery: &amqp.Recovery{}})
	}, rabbitmqtransport.Config{})
	require.NoError(t, err)
	defer tr.Close()
	err = tr.Ping(context.Background())
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Recovery")
	require.False(t, errors.Is(err, outbox.ErrClosed))
}
