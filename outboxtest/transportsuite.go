package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// RunTransportTests runs the transport conformance suite: bytes, keys, payloads,
// tombstones and headers pass through unchanged; every message carries
// [outbox.HeaderMessageID]; per-message failures are reported per message (when
// h.MaxMessageSize is set); per-key order holds (when h.Ordered); a batch of several
// hundred messages goes out in one call.
//
// Every subtest publishes to topics of its own, made by h.New. Subtests run in
// parallel unless h.Sequential is set.
func RunTransportTests(t *testing.T, h TransportHarness) {
	t.Helper()
	require.NotNil(t, h.New, "TransportHarness.New is required")
	require.NotNil(t, h.Read, "TransportHarness.Read is required")
	s := transportSuite{h: h}
	tests := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"PassesBytesThroughUnchanged", s.passThrough},
		{"EmptyBatch", s.emptyBatch},
		{"LargeBatchInOneCall", s.largeBatch},
		{"PerMessageFailures", s.perMessageFailures},
		{"KeyOrder", s.keyOrder},
		{"CancelledContext", s.cancelledContext},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !h.Sequential {
				t.Parallel()
			}
			tc.run(t)
		})
	}
}

type transportSuite struct{ h TransportHarness }

// topicName gives each subtest a topic of its own: letters, digits and hyphens, which
// every broker accepts.
func topicName(prefix string) string {
	return fmt.Sprintf("outbox-conformance-%s-%s", prefix, uuid.NewString()[:8])
}

func envelopeFor(t *testing.T, m outbox.Message) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(m, driver.DefaultBucketCount)
	require.NoError(t, err)
	return env
}

func publish(t *testing.T, tr driver.Transport, batch ...*driver.Envelope) error {
	t.Helper()
	return tr.Publish(testContext(t), batch)
}

// byID indexes received messages by message ID, failing on a duplicate.
func byID(t *testing.T, got []Received) map[string]Received {
	t.Helper()
	out := make(map[string]Received, len(got))
	for _, r := range got {
		_, dup := out[r.ID]
		require.False(t, dup, "message %s arrived twice", r.ID)
		out[r.ID] = r
	}
	return out
}

func (s transportSuite) passThrough(t *testing.T) {
	topic := topicName("bytes")
	tr := s.h.New(t, topic)
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	messages := []outbox.Message{
		{Key: every, Payload: every, Headers: []outbox.Header{
			{Key: "dup", Value: []byte("first")},
			{Key: "empty", Value: []byte{}},
			{Key: "dup", Value: []byte("second")},
			{Key: "binary", Value: every},
			{Key: outbox.HeaderIdempotencyKey, Value: []byte("app-chosen-key")},
		}},
		{Key: nil, Payload: []byte("keyless")},
		{Key: []byte{}, Payload: []byte("empty key")},
		{Key: []byte("tombstone"), Payload: nil},
		{Key: []byte("empty payload"), Payload: []byte{}},
		{Key: []byte("ключ"), Payload: []byte("значение ✓"), Headers: []outbox.Header{{Key: "ключ", Value: []byte("v")}}},
	}
	var sent []*driver.Envelope
	for _, m := range messages {
		m.Topic = topic
		sent = append(sent, envelopeFor(t, m))
	}
	require.NoError(t, publish(t, tr, sent...))
	got := byID(t, s.h.Read(t, topic, len(sent)))
	for _, want := range sent {
		r, ok := got[want.ID.String()]
		require.True(t, ok, "message %s did not arrive (Received.ID must be the envelope ID)", want.ID)
		s.requireSameMessage(t, want, r)
	}
}

// requireSameMessage checks that r is want, delivered unchanged.
func (s transportSuite) requireSameMessage(t *testing.T, want *driver.Envelope, r Received) {
	t.Helper()
	id := want.ID.String()
	require.Equal(t, want.Topic, r.Topic, "topic of %s", id)
	require.True(t, bytes.Equal(want.Key, r.Key), "key of %s: want %q, got %q", id, want.Key, r.Key)
	require.True(t, bytes.Equal(want.Payload, r.Payload), "payload of %s", id)
	if !s.h.EmptyIsNil {
		require.Equal(t, want.Key == nil, r.Key == nil, "nil and empty keys stay distinct (%s)", id)
		require.Equal(t, want.Payload == nil, r.Payload == nil, "a tombstone (nil payload) and an empty payload stay distinct (%s)", id)
	}

	stamped, ok := (&outbox.Message{Headers: r.Headers}).Header(outbox.HeaderMessageID)
	require.True(t, ok, "message %s carries the %s header", id, outbox.HeaderMessageID)
	require.Equal(t, id, string(stamped))

	// The application's headers arrive in order, duplicates and empty values kept.
	// The transport adds the message-ID header and may add an idempotency key the
	// application did not set; nothing else.
	_, appKey := want.Header(outbox.HeaderIdempotencyKey)
	var gotHeaders []outbox.Header
	for _, h := range r.Headers {
		switch {
		case h.Key == outbox.HeaderMessageID:
		case h.Key == outbox.HeaderIdempotencyKey && !appKey && string(h.Value) == id:
		default:
			gotHeaders = append(gotHeaders, h)
		}
	}
	var wantHeaders []outbox.Header
	for _, h := range want.Headers {
		if h.Key != outbox.HeaderMessageID {
			wantHeaders = append(wantHeaders, h)
		}
	}
	require.Len(t, gotHeaders, len(wantHeaders), "headers of %s: got %v", id, gotHeaders)
	for i, h := range wantHeaders {
		require.Equal(t, h.Key, gotHeaders[i].Key, "header %d of %s", i, id)
		require.True(t, bytes.Equal(h.Value, gotHeaders[i].Value), "header %d (%s) of %s", i, h.Key, id)
	}
}

func (s transportSuite) emptyBatch(t *testing.T) {
	topic := topicName("empty")
	tr := s.h.New(t, topic)
	require.NoError(t, publish(t, tr), "publishing nothing is not an error")
	// The topic still works afterwards.
	env := envelopeFor(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: []byte("after")})
	require.NoError(t, publish(t, tr, env))
	got := s.h.Read(t, topic, 1)
	require.Equal(t, env.ID.String(), got[0].ID)
}

func (s transportSuite) largeBatch(t *testing.T) {
	const n = 300
	topic := topicName("large")
	tr := s.h.New(t, topic)
	batch := make([]*driver.Envelope, n)
	for i := range batch {
		batch[i] = envelopeFor(t, outbox.Message{
			Topic:   topic,
			Key:     fmt.Appendf(nil, "key-%d", i%17),
			Payload: fmt.Appendf(nil, "payload-%d", i),
		})
	}
	require.NoError(t, publish(t, tr, batch...), "a batch of %d in one call", n)
	got := byID(t, s.h.Read(t, topic, n))
	for _, want := range batch {
		r, ok := got[want.ID.String()]
		require.True(t, ok, "message %s did not arrive", want.ID)
		require.Equal(t, string(want.Payload), string(r.Payload))
		require.Equal(t, string(want.Key), string(r.Key))
	}
}

func (s transportSuite) perMessageFailures(t *testing.T) {
	if s.h.MaxMessageSize <= 0 {
		t.Skip("TransportHarness.MaxMessageSize is zero: per-message failures are not exercised")
	}
	topic := topicName("oversized")
	tr := s.h.New(t, topic)
	before := envelopeFor(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: []byte("before")})
	big := envelopeFor(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: bytes.Repeat([]byte{'x'}, s.h.MaxMessageSize+1024)})
	after := envelopeFor(t, outbox.Message{Topic: topic, Key: []byte("other"), Payload: []byte("after")})

	err := publish(t, tr, before, big, after)
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe, "a batch with one oversized message reports per message")
	require.Len(t, pe.Failed, 1, "only the oversized message failed: %v", pe)
	require.Equal(t, big.ID, pe.Failed[0].ID)
	require.True(t, driver.IsPermanent(pe.Failed[0].Err), "an oversized message fails permanently: %v", pe.Failed[0].Err)

	got := byID(t, s.h.Read(t, topic, 2))
	require.Contains(t, got, before.ID.String(), "the rest of the batch is delivered")
	require.Contains(t, got, after.ID.String(), "the rest of the batch is delivered")
}

func (s transportSuite) keyOrder(t *testing.T) {
	const (
		keys    = 3
		perKey  = 15
		perCall = 9
	)
	topic := topicName("order")
	tr := s.h.New(t, topic)
	var all []*driver.Envelope
	for i := range perKey {
		for k := range keys {
			all = append(all, envelopeFor(t, outbox.Message{
				Topic:   topic,
				Key:     fmt.Appendf(nil, "key-%d", k),
				Payload: fmt.Appendf(nil, "%d", i),
			}))
		}
	}
	for start := 0; start < len(all); start += perCall {
		require.NoError(t, publish(t, tr, all[start:min(start+perCall, len(all))]...))
	}
	got := s.h.Read(t, topic, len(all))
	byID(t, got) // no duplicates
	seq := map[string][]string{}
	for _, r := range got {
		seq[string(r.Key)] = append(seq[string(r.Key)], string(r.Payload))
	}
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		require.Len(t, seq[key], perKey, "every message of %s arrived", key)
		if !s.h.Ordered {
			continue
		}
		for i, p := range seq[key] {
			require.Equal(t, fmt.Sprint(i), p, "messages of %s arrive in publish order", key)
		}
	}
}

func (s transportSuite) cancelledContext(t *testing.T) {
	topic := topicName("cancelled")
	tr := s.h.New(t, topic)
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	env := envelopeFor(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: []byte("p")})
	err := tr.Publish(ctx, []*driver.Envelope{env})
	require.Error(t, err, "a publish with a cancelled context cannot report success")
	require.True(t, errors.Is(err, context.Canceled), "the error says the context was cancelled: %v", err)
}
