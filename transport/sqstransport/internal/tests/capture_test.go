package tests

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// offlineTransport builds a transport on a client that is never used: New never dials.
func offlineTransport(t *testing.T, cfg sqstransport.Config) *sqstransport.Transport {
	t.Helper()
	return newTransport(t, sqs.New(sqs.Options{Region: "us-east-1"}), cfg)
}

// With OmitIdempotencyKey the limit is larger (the reserve holds no idempotency key):
// a message of that Size is still published, whatever its shape (a binary payload,
// sent as base64; a text one; a key and 32 headers), and carries no idempotency key.
// One byte more is refused before sending, permanently, with outbox.ErrTooLarge,
// and the rest of the batch is sent. The relay suite's SizeLimit/AtTheLimit runs the
// default configuration.
func TestMessageAtTheLimitWithoutTheIdempotencyKey(t *testing.T) {
	t.Parallel()
	srv, name, url := setup(t, false, nil)
	client := srv.Client()
	tr := newTransport(t, client, sqstransport.Config{OmitIdempotencyKey: true})
	limit := tr.MaxMessageSize()
	require.Greater(t, limit, offlineTransport(t, sqstransport.Config{}).MaxMessageSize())
	var headers []outbox.Header
	for i := range 32 { // as many headers as the limit always has room for
		headers = append(headers, outbox.Header{Key: "h-" + strings.Repeat(string(rune('z'-i%26)), 1+i), Value: []byte("v")})
	}
	shapes := []outbox.Message{
		{Topic: name, Payload: bytes.Repeat([]byte{0xff}, limit-len(name))},
		{Topic: name, Payload: bytes.Repeat([]byte{'x'}, limit-len(name))},
		{Topic: name, Key: []byte("customer-7"), Headers: headers},
	}
	last := &shapes[len(shapes)-1]
	last.Payload = bytes.Repeat([]byte{0x01}, limit-last.Size())

	var atLimit, over []*driver.Envelope
	for _, m := range shapes {
		require.Equal(t, limit, m.Size())
		atLimit = append(atLimit, envelope(t, m.Topic, m.Key, m.Payload, m.Headers...))
		m.Payload = append(m.Payload, m.Payload[0])
		over = append(over, envelope(t, m.Topic, m.Key, m.Payload, m.Headers...))
	}
	require.NoError(t, tr.Publish(context.Background(), atLimit))
	got, _ := receive(t, client, url, len(atLimit))
	for _, d := range got {
		env := atLimit[mustIndex(t, atLimit, d.ID)]
		assert.Equal(t, env.Payload, d.Payload)
		_, stamped := d.Header(outbox.HeaderIdempotencyKey)
		assert.False(t, stamped)
	}

	ok := envelope(t, name, []byte("k"), []byte("fine"))
	err := tr.Publish(context.Background(), append(over, ok))
	var perr *driver.PublishError
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, len(over))
	for _, f := range perr.Failed {
		assert.True(t, driver.IsPermanent(f.Err), "%v", f.Err)
		assert.ErrorIs(t, f.Err, outbox.ErrTooLarge)
	}
	got, _ = receive(t, client, url, 1)
	assert.Equal(t, ok.ID, got[0].ID)
}

// The transport's limit is what capture learns through outbox.SenderConfig.Transport.
func TestTransportIsASizeLimiter(t *testing.T) {
	t.Parallel()
	var limiter driver.SizeLimiter = offlineTransport(t, sqstransport.Config{})
	assert.Less(t, limiter.MaxMessageSize(), sqstransport.DefaultQueueLimit)
	big := offlineTransport(t, sqstransport.Config{QueueLimit: sqstransport.MaxQueueLimit})
	assert.Greater(t, big.MaxMessageSize(), 3*sqstransport.MaxQueueLimit/4-4096)
}
