package tests

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// awkwardHeaders are headers NATS headers cannot carry unchanged: empty and nil
// values, every byte value, CR and LF, blanks at the edges, non-ASCII and reserved
// names, repeated names out of order, and many of them.
func awkwardHeaders() []outbox.Header {
	return append(outboxtest.AwkwardHeaders(),
		outbox.Header{Key: "Nats-Expected-Stream", Value: []byte("not for JetStream")},
		outbox.Header{Key: natstransport.HeaderPacked, Value: []byte("the application's own")},
	)
}

// appOnly drops what the transport stamped: the message id (last) and the
// idempotency key it added (after the application's packed headers; among plain ones
// in name order).
func appOnly(t *testing.T, d natstransport.Delivery) []outbox.Header {
	t.Helper()
	require.NotEmpty(t, d.Headers)
	require.Equal(t, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(d.ID.String())}, d.Headers[len(d.Headers)-1])
	var out []outbox.Header
	stamped := 0
	for _, h := range d.Headers[:len(d.Headers)-1] {
		if h.Key == outbox.HeaderIdempotencyKey && string(h.Value) == d.ID.String() {
			stamped++
			continue
		}
		out = append(out, h)
	}
	require.Equal(t, 1, stamped, "one idempotency key stamped")
	return out
}

// Awkward headers go through the server packed and come back exactly, nil and empty
// values apart; plain headers beside them go as NATS headers of their own.
func TestAwkwardHeadersRoundTripThroughTheServer(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	subject := streamName("headers")
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{subject}})
	tr := newTransport(t, js, natstransport.Config{})
	awkward := envelope(t, outbox.Message{Topic: subject, Key: []byte("k"), Payload: []byte("awkward"), Headers: awkwardHeaders()})
	plain := envelope(t, outbox.Message{Topic: subject, Key: []byte("k"), Payload: []byte("plain"), Headers: []outbox.Header{
		{Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte{}}, {Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
	}})
	require.NoError(t, tr.Publish(t.Context(), []*driver.Envelope{awkward, plain}))

	cons := newReader(t, s, subject).cons
	var msgs []jetstream.Msg
	deadline := time.Now().Add(30 * time.Second)
	for len(msgs) < 2 {
		require.True(t, time.Now().Before(deadline), "only %d of 2 messages arrived", len(msgs))
		batch, err := cons.Fetch(2-len(msgs), jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			require.NoError(t, err)
		}
	}

	// What the server stored: the awkward headers in one packed header, the plain ones
	// as NATS headers.
	require.Len(t, msgs[0].Headers().Values(natstransport.HeaderPacked), 1)
	assert.Empty(t, msgs[0].Headers().Values("empty"), "packed headers are not NATS headers too")
	assert.Empty(t, msgs[1].Headers().Values(natstransport.HeaderPacked))
	assert.Equal(t, []string{"1", ""}, msgs[1].Headers().Values("a"))

	for i, env := range []*driver.Envelope{awkward, plain} {
		d, err := natstransport.Decode(msgs[i])
		require.NoError(t, err)
		require.Equal(t, env.ID, d.ID)
		got := appOnly(t, d)
		require.Len(t, got, len(env.Headers))
		for j, h := range env.Headers {
			assert.Equal(t, h.Key, got[j].Key, "header %d", j)
			assert.Equal(t, h.Value, got[j].Value, "header %d (%s)", j, h.Key)
			assert.Equal(t, h.Value == nil, got[j].Value == nil, "header %d (%s): nil and empty stay apart", j, h.Key)
		}
	}
}
