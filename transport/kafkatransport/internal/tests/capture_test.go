package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// atLimit returns msg with a random (incompressible) payload that brings its Size to
// exactly size.
func atLimit(t *testing.T, msg outbox.Message, size int) outbox.Message {
	t.Helper()
	msg.Payload = nil
	msg.Payload = make([]byte, size-msg.Size())
	_, _ = rand.Read(msg.Payload)
	require.Equal(t, size, msg.Size())
	return msg
}

// A message whose Size is exactly the transport's MaxMessageSize (the default, what
// kgo's default batches carry) is published, payload only or with a key and the 28
// headers the limit always has room for. One byte more is refused before sending,
// permanently, with outbox.ErrTooLarge, and the rest of the batch is sent.
func TestMessageAtTheLimitIsPublishedOneByteOverIsRefused(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "limit")
	tr := newTransport(t, c, kafkatransport.Config{})
	limit := tr.MaxMessageSize()
	require.Equal(t, 1_000_012-512, limit)

	var headers []outbox.Header
	for i := range 28 {
		headers = append(headers, outbox.Header{Key: fmt.Sprint("h", i), Value: []byte{byte(i)}})
	}
	shapes := []outbox.Message{
		{Topic: "limit"},
		{Topic: "limit", Key: []byte("customer-7"), Headers: headers},
	}
	consumer := newConsumer(t, c, "limit")
	for _, shape := range shapes {
		at := envelope(t, atLimit(t, shape, limit))
		require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{at}), "%d headers", len(shape.Headers))
		got := decodeAll(t, consumer.read(t, 1))
		assert.Equal(t, at.ID, got[0].ID)
		assert.Equal(t, at.Payload, got[0].Payload)

		over := envelope(t, atLimit(t, shape, limit+1))
		ok := envelope(t, outbox.Message{Topic: "limit", Payload: []byte("fine")})
		err := tr.Publish(context.Background(), []*driver.Envelope{over, ok})
		var pe *driver.PublishError
		require.ErrorAs(t, err, &pe)
		require.Len(t, pe.Failed, 1)
		assert.Equal(t, over.ID, pe.Failed[0].ID)
		assert.True(t, driver.IsPermanent(pe.Failed[0].Err))
		assert.ErrorIs(t, pe.Failed[0].Err, outbox.ErrTooLarge)
		assert.Equal(t, ok.ID, decodeAll(t, consumer.read(t, 1))[0].ID)
	}
}

// Wired into capture through SenderConfig.Transport, the transport's limit refuses a
// message at Send, before anything is written, in a unit of work and outside one: one
// byte over the default limit (which the memory store's own 1 MiB limit would take)
// fails with ErrTooLarge, and the store holds nothing. A message at the limit is
// captured, relayed and delivered. Without the wiring, capture takes the oversized
// message and the relay parks it on its first attempt.
func TestCaptureWiredToTheTransportRefusesWhatItCannotCarry(t *testing.T) {
	t.Parallel()
	c := newCluster(t, e2eBuckets, "wired")
	tr := newTransport(t, c, kafkatransport.Config{})
	store, d := newRelay(t, tr, nil)
	ctx := context.Background()
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: tr})
	require.NoError(t, err)
	require.Less(t, tr.MaxMessageSize(), store.MaxMessageSize())

	over := atLimit(t, outbox.Message{Topic: "wired", Key: []byte("k")}, tr.MaxMessageSize()+1)
	err = store.Transact(ctx, func(ctx context.Context) error { return sender.Send(ctx, over) })
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	immediate, err := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate, Transport: tr})
	require.NoError(t, err)
	require.ErrorIs(t, immediate.Send(ctx, over), outbox.ErrTooLarge)
	stats, err := store.Driver().(driver.Admin).Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, total(stats.Pending), "nothing was written")

	within := atLimit(t, outbox.Message{Topic: "wired", Key: []byte("k")}, tr.MaxMessageSize())
	require.NoError(t, store.Transact(ctx, func(ctx context.Context) error { return sender.Send(ctx, within) }))
	relay := func() {
		t.Helper()
		for range 10 {
			_, err := d.RunOnce(ctx)
			require.NoError(t, err)
			stats, err := store.Driver().(driver.Admin).Stats(ctx)
			require.NoError(t, err)
			if total(stats.Pending) == 0 {
				return
			}
		}
		t.Fatal("the relay left messages pending")
	}
	relay()
	got := decodeAll(t, newConsumer(t, c, "wired").read(t, 1))
	assert.Equal(t, within.Payload, got[0].Payload)
	assert.Equal(t, int64(1), d.Stats().Published)

	unwired, err := outbox.NewSender(store, outbox.SenderConfig{})
	require.NoError(t, err)
	require.NoError(t, store.Transact(ctx, func(ctx context.Context) error { return unwired.Send(ctx, over) }))
	relay()
	assert.Zero(t, d.Stats().Retried, "a permanent failure is not retried")
	parked, err := store.Driver().(driver.Admin).List(ctx, driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1, "the relay parks what capture did not check")
	assert.Contains(t, parked[0].LastError, "Config.MaxMessageSize")
}

// A Message.ID the application set is the message's ID end to end: captured through
// outbox.NewSender inside a unit of work and relayed, the record carries exactly that
// ID, once, in the outbox.HeaderMessageID header (and as the idempotency key the
// transport adds), keyed or keyless. A message sent with a zero ID in the same unit
// gets an ID of its own.
func TestCallerSetMessageIDReachesTheBroker(t *testing.T) {
	t.Parallel()
	c := newCluster(t, e2eBuckets, "caller-id")
	tr := newTransport(t, c, kafkatransport.Config{})
	store, d := newRelay(t, tr, nil)
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: tr})
	require.NoError(t, err)
	ctx := context.Background()

	keyed := uuid.MustParse("6f1c2a4e-3b9d-4c1e-9a7f-2d5e8b0c4a11") // a v4: not what capture draws
	keyless := uuid.MustParse("018f3b2a-7c4d-7e5f-8a9b-0c1d2e3f4a5b")
	require.NoError(t, store.Transact(ctx, func(ctx context.Context) error {
		for _, msg := range []outbox.Message{
			{ID: keyed, Topic: "caller-id", Key: []byte("order-7"), Payload: []byte("placed")},
			{ID: keyless, Topic: "caller-id", Payload: []byte("audit")},
			{Topic: "caller-id", Key: []byte("order-8"), Payload: []byte("drawn")},
		} {
			if err := sender.Send(ctx, msg); err != nil {
				return err
			}
		}
		return nil
	}))

	for round := 0; ; round++ {
		require.Less(t, round, 10, "the relay publishes the unit's messages")
		_, err := d.RunOnce(ctx)
		require.NoError(t, err)
		stats, err := store.Driver().(driver.Admin).Stats(ctx)
		require.NoError(t, err)
		if total(stats.Pending) == 0 {
			break
		}
	}
	assert.Equal(t, int64(3), d.Stats().Published)

	byPayload := map[string][]string{}
	for _, rec := range newConsumer(t, c, "caller-id").read(t, 3) {
		for _, h := range rec.Headers {
			if h.Key == outbox.HeaderMessageID {
				byPayload[string(rec.Value)] = append(byPayload[string(rec.Value)], string(h.Value))
			}
		}
		if string(rec.Value) != "drawn" {
			key, ok := headerOf(rec, outbox.HeaderIdempotencyKey)
			require.True(t, ok)
			assert.Equal(t, byPayload[string(rec.Value)][0], key, "the idempotency key is the message ID")
		}
	}
	assert.Equal(t, []string{keyed.String()}, byPayload["placed"], "the caller's ID, once")
	assert.Equal(t, []string{keyless.String()}, byPayload["audit"], "the caller's ID, once")
	require.Len(t, byPayload["drawn"], 1)
	drawn, err := uuid.Parse(byPayload["drawn"][0])
	require.NoError(t, err)
	assert.EqualValues(t, 7, drawn.Version(), "a zero ID gets a UUIDv7")
	assert.NotContains(t, []uuid.UUID{keyed, keyless}, drawn)
}

// headerOf returns the value of the last header of rec named key.
func headerOf(rec *kgo.Record, key string) (string, bool) {
	var v string
	var ok bool
	for _, h := range rec.Headers {
		if h.Key == key {
			v, ok = string(h.Value), true
		}
	}
	return v, ok
}

// The idempotency key is the transport's to add, and Config.OmitIdempotencyKey is
// the one switch: capture stores the message without one; the transport adds one
// equal to the message id unless the switch is set, and keeps the application's own.
func TestIdempotencyKeyIsAddedByTheTransport(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{BucketCount: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, sender.Send(ctx, outbox.Message{Topic: "idem", Key: []byte("a"), Payload: []byte("1")}))
	require.NoError(t, sender.Send(ctx, outbox.Message{Topic: "idem", Key: []byte("b"), Payload: []byte("2"),
		Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("charge-2")}}}))
	batch, err := store.Driver().Fetch(ctx, 0, 10)
	require.NoError(t, err)
	envs := batch.Envelopes
	require.Len(t, envs, 2)
	_, ok := envs[0].Header(outbox.HeaderIdempotencyKey)
	require.False(t, ok, "capture adds no idempotency key")

	for _, omit := range []bool{false, true} {
		c := newCluster(t, 1, "idem")
		tr := newTransport(t, c, kafkatransport.Config{OmitIdempotencyKey: omit})
		require.NoError(t, tr.Publish(ctx, envs))
		got := decodeAll(t, newConsumer(t, c, "idem").read(t, 2))
		key, ok := got[0].Header(outbox.HeaderIdempotencyKey)
		assert.Equal(t, !omit, ok, "omit %v", omit)
		if ok {
			assert.Equal(t, got[0].ID.String(), string(key))
		}
		key, _ = got[1].Header(outbox.HeaderIdempotencyKey)
		assert.Equal(t, "charge-2", string(key), "the application's key is kept")
	}
}

func total(counts []int) int {
	n := 0
	for _, v := range counts {
		n += v
	}
	return n
}
