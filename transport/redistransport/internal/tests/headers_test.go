package tests

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// awkwardHeaders are headers that test the packed field: empty and nil values, every
// byte value, CR and LF, blanks at the edges, non-ASCII names, names like the
// entry's own fields, repeated names out of order, and many of them.
func awkwardHeaders() []outbox.Header {
	return append(outboxtest.AwkwardHeaders(),
		outbox.Header{Key: redistransport.FieldPayload, Value: []byte("not the payload")},
		outbox.Header{Key: redistransport.FieldMessageID, Value: []byte("not the message id")},
	)
}

// Awkward headers go through the server in the entry's headers field and come back
// exactly, nil and empty values apart.
func TestAwkwardHeadersRoundTripThroughTheServer(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	stream := streamKey(t, client, "headers")
	tr := newTransport(t, client, redistransport.Config{})
	env := envelope(t, outbox.Message{Topic: stream, Key: []byte("k"), Payload: []byte("p"), Headers: awkwardHeaders()})
	require.NoError(t, tr.Publish(t.Context(), []*driver.Envelope{env}))

	entries, err := client.XRange(t.Context(), stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, entries, 1)
	// What the server stored is the driver's encoding, byte for byte.
	assert.Equal(t, string(driver.EncodeHeaders(env.Headers)), entries[0].Values[redistransport.FieldHeaders])

	d, err := redistransport.Decode(stream, entries[0])
	require.NoError(t, err)
	require.Equal(t, env.ID, d.ID)
	assert.Equal(t, []byte("p"), d.Payload)
	// The application's headers, then the idempotency key and the message id the
	// transport stamped.
	require.Len(t, d.Headers, len(env.Headers)+2)
	assert.Equal(t, outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte(env.ID.String())}, d.Headers[len(env.Headers)])
	assert.Equal(t, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(env.ID.String())}, d.Headers[len(env.Headers)+1])
	for j, h := range env.Headers {
		assert.Equal(t, h.Key, d.Headers[j].Key, "header %d", j)
		assert.Equal(t, h.Value, d.Headers[j].Value, "header %d (%s)", j, h.Key)
		assert.Equal(t, h.Value == nil, d.Headers[j].Value == nil, "header %d (%s): nil and empty stay apart", j, h.Key)
	}
}
