package watermilltransport_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// pubsub is Watermill's in-process pub/sub, keeping what was published so a
// subscriber that comes later reads it all.
func pubsub(t *testing.T) *gochannel.GoChannel {
	t.Helper()
	ps := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	t.Cleanup(func() { _ = ps.Close() })
	return ps
}

// read takes n messages from topic, decoded and acknowledged.
func read(t *testing.T, ps *gochannel.GoChannel, topic string, n int) []watermilltransport.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := ps.Subscribe(ctx, topic)
	require.NoError(t, err)
	out := make([]watermilltransport.Delivery, 0, n)
	for len(out) < n {
		select {
		case m := <-msgs:
			d, err := watermilltransport.Decode(m)
			require.NoError(t, err)
			m.Ack()
			out = append(out, d)
		case <-ctx.Done():
			t.Fatalf("only %d of %d messages arrived on %s", len(out), n, topic)
		}
	}
	return out
}

// faulty wraps a real publisher: it counts calls, and fails calls to topics in fail.
type faulty struct {
	message.Publisher
	mu    sync.Mutex
	calls []string            // topic of each call
	sent  map[string][]string // payloads handed to the publisher, per topic, in order
	fail  map[string]error
}

func (f *faulty) Publish(topic string, msgs ...*message.Message) error {
	f.mu.Lock()
	f.calls = append(f.calls, topic)
	err := f.fail[topic]
	if err == nil {
		if f.sent == nil {
			f.sent = map[string][]string{}
		}
		for _, m := range msgs {
			f.sent[topic] = append(f.sent[topic], string(m.Payload))
		}
	}
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.Publisher.Publish(topic, msgs...)
}

func envelope(t *testing.T, m outbox.Message) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(m, driver.DefaultBucketCount)
	require.NoError(t, err)
	return env
}

func newTransport(t *testing.T, pub message.Publisher, cfg watermilltransport.Config) *watermilltransport.Transport {
	t.Helper()
	tr, err := watermilltransport.New(pub, cfg)
	require.NoError(t, err)
	return tr
}

func TestConfig(t *testing.T) {
	_, err := watermilltransport.New(nil, watermilltransport.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "publisher is nil")
	err = watermilltransport.Config{MaxMessageSize: -1}.Validate()
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Config.MaxMessageSize")

	tr := newTransport(t, pubsub(t), watermilltransport.Config{})
	assert.Zero(t, tr.MaxMessageSize(), "no limit by default")
	assert.True(t, tr.KeepsKeyOrder())
	partial := newTransport(t, pubsub(t), watermilltransport.Config{PartialFailures: true})
	assert.False(t, partial.KeepsKeyOrder(), "a publisher that fails messages one by one cannot keep a call's key order")
	assert.NoError(t, tr.Ping(context.Background()), "without Config.Ping, Ping reports nil")
	var pub message.Publisher
	require.True(t, tr.As(&pub))
	assert.NotNil(t, pub)
	var other int
	assert.False(t, tr.As(&other))

	down := newTransport(t, pubsub(t), watermilltransport.Config{Ping: func(context.Context) error { return errors.New("not connected") }})
	assert.ErrorContains(t, down.Ping(context.Background()), "not connected")
}

// Keys, payloads and headers round-trip byte for byte through Watermill metadata,
// which is a map of strings: order, repeated names, binary values and keys, nil and
// empty keys and a tombstone survive.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	ps := pubsub(t)
	tr := newTransport(t, ps, watermilltransport.Config{})
	binary := []byte{0, 0xff, 0xfe, 'x', 0x80}
	msgs := []outbox.Message{
		{Topic: "t", Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{
			{Key: "dup", Value: []byte("first")},
			{Key: "empty", Value: []byte{}},
			{Key: "dup", Value: []byte("second")},
			{Key: "binary", Value: binary},
			{Key: outbox.HeaderIdempotencyKey, Value: []byte("app-key")},
		}},
		{Topic: "t", Key: nil, Payload: []byte("keyless")},
		{Topic: "t", Key: []byte{}, Payload: []byte{}},
		{Topic: "t", Key: binary, Payload: nil},
	}
	var sent []*driver.Envelope
	for _, m := range msgs {
		sent = append(sent, envelope(t, m))
	}
	require.NoError(t, tr.Publish(context.Background(), sent))
	got := map[uuid.UUID]watermilltransport.Delivery{}
	for _, d := range read(t, ps, "t", len(sent)) {
		got[d.ID] = d
	}
	for i, want := range sent {
		d, ok := got[want.ID]
		require.True(t, ok, "message %d arrived", i)
		assert.Equal(t, "t", d.Topic)
		assert.True(t, bytes.Equal(want.Key, d.Key))
		assert.Equal(t, want.Key == nil, d.Key == nil, "nil and empty keys stay distinct")
		assert.True(t, bytes.Equal(want.Payload, d.Payload))
		assert.Equal(t, want.Payload == nil, d.Payload == nil, "a tombstone stays distinct")
		wantHeaders := append([]outbox.Header{}, want.Headers...)
		wantHeaders = append(wantHeaders, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(want.ID.String())})
		if _, ok := want.Header(outbox.HeaderIdempotencyKey); !ok {
			wantHeaders = append(wantHeaders, outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte(want.ID.String())})
		}
		require.Len(t, d.Headers, len(wantHeaders))
		for j := range wantHeaders {
			assert.Equal(t, wantHeaders[j].Key, d.Headers[j].Key)
			assert.True(t, bytes.Equal(wantHeaders[j].Value, d.Headers[j].Value), "header %d of message %d", j, i)
		}
	}
}

// One call per topic; a key that moves between topics starts another call, so the
// key's messages still go out in batch order.
func TestCallsPerTopic(t *testing.T) {
	t.Parallel()
	ps := pubsub(t)
	f := &faulty{Publisher: ps}
	tr := newTransport(t, f, watermilltransport.Config{})
	batch := []*driver.Envelope{
		envelope(t, outbox.Message{Topic: "a", Key: []byte("1"), Payload: []byte("a1")}),
		envelope(t, outbox.Message{Topic: "b", Key: []byte("2"), Payload: []byte("b2")}),
		envelope(t, outbox.Message{Topic: "a", Key: []byte("3"), Payload: []byte("a3")}),
		envelope(t, outbox.Message{Topic: "b", Key: []byte("3"), Payload: []byte("b3")}), // key 3 moves to b
		envelope(t, outbox.Message{Topic: "a", Key: []byte("3"), Payload: []byte("a3 again")}),
		envelope(t, outbox.Message{Topic: "a", Key: nil, Payload: []byte("keyless")}),
	}
	require.NoError(t, tr.Publish(context.Background(), batch))
	assert.Equal(t, []string{"a", "b", "a"}, f.calls)
	assert.Equal(t, []string{"a1", "a3", "a3 again", "keyless"}, f.sent["a"], "the order handed to the publisher")
	assert.Equal(t, []string{"b2", "b3"}, f.sent["b"])
	assert.Len(t, read(t, ps, "a", 4), 4)
}

// A failed call fails every message in it, transiently unless Config.Permanent says
// so, and holds back the later messages of their keys; other calls go through.
func TestFailedCall(t *testing.T) {
	t.Parallel()
	for _, permanent := range []bool{false, true} {
		t.Run(fmt.Sprint("permanent=", permanent), func(t *testing.T) {
			t.Parallel()
			ps := pubsub(t)
			boom := errors.New("broker says no")
			f := &faulty{Publisher: ps, fail: map[string]error{"bad": boom}}
			cfg := watermilltransport.Config{}
			if permanent {
				cfg.Permanent = func(err error) bool { return errors.Is(err, boom) }
			}
			tr := newTransport(t, f, cfg)
			bad1 := envelope(t, outbox.Message{Topic: "bad", Key: []byte("k"), Payload: []byte("1")})
			good := envelope(t, outbox.Message{Topic: "good", Key: []byte("other"), Payload: []byte("2")})
			bad2 := envelope(t, outbox.Message{Topic: "bad", Key: []byte("j"), Payload: []byte("3")})
			held := envelope(t, outbox.Message{Topic: "good", Key: []byte("k"), Payload: []byte("4")})

			err := tr.Publish(context.Background(), []*driver.Envelope{bad1, good, bad2, held})
			var pe *driver.PublishError
			require.ErrorAs(t, err, &pe)
			failed := map[uuid.UUID]error{}
			for _, m := range pe.Failed {
				failed[m.ID] = m.Err
			}
			require.Len(t, failed, 3, "the bad call's two messages and the later one of key k")
			for _, id := range []uuid.UUID{bad1.ID, bad2.ID} {
				assert.ErrorIs(t, failed[id], boom)
				assert.ErrorContains(t, failed[id], "fails as a whole")
				assert.Equal(t, permanent, driver.IsPermanent(failed[id]))
			}
			assert.False(t, driver.IsPermanent(failed[held.ID]), "held back is transient")
			assert.ErrorContains(t, failed[held.ID], "earlier message of its key")
			assert.Equal(t, good.ID, read(t, ps, "good", 1)[0].ID)
		})
	}
}

// A message over MaxMessageSize or with a header named like the transport's own fails
// alone, permanently, before anything is sent; its key's later messages are held back.
func TestRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	ps := pubsub(t)
	tr := newTransport(t, ps, watermilltransport.Config{MaxMessageSize: 100})
	ok := envelope(t, outbox.Message{Topic: "t", Key: []byte("a"), Payload: []byte("fine")})
	big := envelope(t, outbox.Message{Topic: "t", Key: []byte("b"), Payload: make([]byte, 200)})
	after := envelope(t, outbox.Message{Topic: "t", Key: []byte("b"), Payload: []byte("after")})
	named := envelope(t, outbox.Message{Topic: "t", Key: []byte("c"), Headers: []outbox.Header{{Key: watermilltransport.MetadataKey}}})
	err := tr.Publish(context.Background(), []*driver.Envelope{ok, big, after, named})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 3)
	assert.Equal(t, big.ID, pe.Failed[0].ID)
	assert.ErrorIs(t, pe.Failed[0].Err, outbox.ErrTooLarge)
	assert.True(t, driver.IsPermanent(pe.Failed[0].Err))
	assert.Equal(t, after.ID, pe.Failed[1].ID)
	assert.False(t, driver.IsPermanent(pe.Failed[1].Err))
	assert.Equal(t, named.ID, pe.Failed[2].ID)
	assert.ErrorIs(t, pe.Failed[2].Err, outbox.ErrInvalidMessage)
	assert.True(t, driver.IsPermanent(pe.Failed[2].Err))
	assert.Equal(t, ok.ID, read(t, ps, "t", 1)[0].ID)
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	f := &faulty{Publisher: pubsub(t)}
	tr := newTransport(t, f, watermilltransport.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := tr.Publish(ctx, []*driver.Envelope{envelope(t, outbox.Message{Topic: "t", Payload: []byte("p")})})
	require.ErrorIs(t, err, context.Canceled)
	assert.Empty(t, f.calls, "nothing is published on a cancelled context")
}

func TestDecodeRefusesForeignMessage(t *testing.T) {
	_, err := watermilltransport.Decode(message.NewMessage("x", []byte("hi")))
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorContains(t, err, outbox.HeaderMessageID)
}
