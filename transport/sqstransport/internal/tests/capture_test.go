package tests

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// offlineTransport builds a transport on a client that is never used: New never dials.
func offlineTransport(t *testing.T, cfg sqstransport.Config) *sqstransport.Transport {
	t.Helper()
	return newTransport(t, sqs.New(sqs.Options{Region: "us-east-1"}), cfg)
}

// A message whose Size is exactly Transport.MaxMessageSize is published, whatever its
// shape: a binary payload (sent as base64), a text one, a key and headers. One byte
// more is refused before sending, permanently, with outbox.ErrTooLarge, and the rest
// of the batch is sent.
func TestMessageAtTheLimitIsPublishedOneByteOverIsRefused(t *testing.T) {
	t.Parallel()
	srv, name, url := setup(t, false, nil)
	client := srv.Client()
	for _, omit := range []bool{false, true} {
		tr := newTransport(t, client, sqstransport.Config{OmitIdempotencyKey: omit})
		limit := tr.MaxMessageSize()
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
		require.NoError(t, tr.Publish(context.Background(), atLimit), "omit %v", omit)
		got, _ := receive(t, client, url, len(atLimit))
		for _, d := range got {
			env := atLimit[mustIndex(t, atLimit, d.ID)]
			assert.Equal(t, env.Payload, d.Payload)
			_, stamped := d.Header(outbox.HeaderIdempotencyKey)
			assert.Equal(t, !omit, stamped)
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
}

// Wired into capture through SenderConfig.Transport, the transport's limit refuses a
// message at Send, before anything is written: a 500 KiB message on the default
// 256 KiB queue limit fails with ErrTooLarge (which is also ErrInvalidMessage), inside
// a unit of work and outside one, and the store holds nothing. A message at the limit
// is captured, relayed and delivered.
func TestCaptureWiredToTheTransportRefusesWhatItCannotCarry(t *testing.T) {
	t.Parallel()
	srv, name, url := setup(t, false, nil)
	tr := newTransport(t, srv.Client(), sqstransport.Config{})
	store, err := memstore.New(memstore.Config{}) // its own limit (1 MiB) would take the message
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: tr})
	require.NoError(t, err)
	ctx := context.Background()

	huge := outbox.Message{Topic: name, Key: []byte("k"), Payload: bytes.Repeat([]byte{'x'}, 500<<10)}
	err = store.Transact(ctx, func(ctx context.Context) error {
		return sender.Send(ctx, huge)
	})
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	immediate, err := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate, Transport: tr})
	require.NoError(t, err)
	require.ErrorIs(t, immediate.Send(ctx, huge), outbox.ErrTooLarge)
	over := outbox.Message{Topic: name, Payload: bytes.Repeat([]byte{0xff}, tr.MaxMessageSize()-len(name)+1)}
	require.ErrorIs(t, immediate.Send(ctx, over), outbox.ErrTooLarge)
	require.Zero(t, pendingCount(t, store), "nothing was written")

	within := outbox.Message{Topic: name, Key: []byte("k"), Payload: bytes.Repeat([]byte{0xff}, tr.MaxMessageSize()-len(name)-1)}
	require.NoError(t, store.Transact(ctx, func(ctx context.Context) error {
		return sender.Send(ctx, within)
	}))
	require.Equal(t, 1, pendingCount(t, store))

	d, err := relay.New(store, tr, relay.Config{RelayID: "sqs-capture", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	for round := 0; pendingCount(t, store) > 0; round++ {
		require.Less(t, round, 10, "the relay publishes the message")
		_, err = d.RunOnce(ctx)
		require.NoError(t, err)
	}
	parked, err := store.Driver().(driver.Admin).List(ctx, driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Empty(t, parked, "published, not parked")
	got, _ := receive(t, srv.Client(), url, 1)
	assert.Equal(t, within.Payload, got[0].Payload)
}

// The idempotency key is the transport's to add, and Config.OmitIdempotencyKey is
// the one switch: capture stores the message without one, the transport adds one
// equal to the message ID unless the switch is set, and keeps the application's own.
func TestIdempotencyKeyIsAddedByTheTransport(t *testing.T) {
	t.Parallel()
	srv, name, url := setup(t, false, nil)
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, sender.Send(ctx, outbox.Message{Topic: name, Key: []byte("a"), Payload: []byte("1")}))
	require.NoError(t, sender.Send(ctx, outbox.Message{Topic: name, Key: []byte("b"), Payload: []byte("2"),
		Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("charge-2")}}}))
	var envs []*driver.Envelope
	for bucket := range store.Driver().BucketCount() {
		got, err := store.Driver().Fetch(ctx, bucket, 10)
		require.NoError(t, err)
		envs = append(envs, got.Envelopes...)
	}
	require.Len(t, envs, 2)
	for _, env := range envs {
		if string(env.Key) == "a" {
			_, ok := env.Header(outbox.HeaderIdempotencyKey)
			require.False(t, ok, "capture adds no idempotency key")
		}
	}

	for _, omit := range []bool{false, true} {
		tr := newTransport(t, srv.Client(), sqstransport.Config{OmitIdempotencyKey: omit})
		require.NoError(t, tr.Publish(ctx, envs))
		got, _ := receive(t, srv.Client(), url, len(envs))
		for _, d := range got {
			key, ok := d.Header(outbox.HeaderIdempotencyKey)
			switch string(d.Key) {
			case "a":
				assert.Equal(t, !omit, ok, "omit %v", omit)
				if ok {
					assert.Equal(t, d.ID.String(), string(key))
				}
			case "b":
				assert.Equal(t, "charge-2", string(key), "the application's key is kept")
			}
		}
	}
}

// The transport's limit is what capture learns through outbox.SenderConfig.Transport.
func TestTransportIsASizeLimiter(t *testing.T) {
	t.Parallel()
	var limiter driver.SizeLimiter = offlineTransport(t, sqstransport.Config{})
	assert.Less(t, limiter.MaxMessageSize(), sqstransport.DefaultQueueLimit)
	big := offlineTransport(t, sqstransport.Config{QueueLimit: sqstransport.MaxQueueLimit})
	assert.Greater(t, big.MaxMessageSize(), 3*sqstransport.MaxQueueLimit/4-4096)
}
