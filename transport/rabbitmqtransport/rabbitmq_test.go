package rabbitmqtransport

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

func newTestTransport(t *testing.T, cfg Config) *Transport {
	t.Helper()
	tr, err := New(func(context.Context) (*amqp.Connection, error) { return nil, errors.New("no broker in unit tests") }, cfg)
	require.NoError(t, err)
	return tr
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, Config{}.Validate())
	err := Config{MaxMessageSize: -1}.Validate()
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.Contains(t, err.Error(), "Config.MaxMessageSize")

	_, err = New(nil, Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.Contains(t, err.Error(), "dial is nil")
}

func TestDefaults(t *testing.T) {
	tr := newTestTransport(t, Config{})
	require.Equal(t, DefaultMaxMessageSize, tr.MaxMessageSize())
	require.Equal(t, DefaultConfirmTimeout, tr.cfg.ConfirmTimeout)
	ex, rk := tr.cfg.Route(&driver.Envelope{Message: outbox.Message{Topic: "orders", Key: []byte("k1")}})
	require.Equal(t, "orders", ex)
	require.Equal(t, "k1", rk)
}

// A publish whose dialer fails reports the dial error, not a PublishError: nothing
// was sent.
func TestPublishWithoutBrokerReportsDialError(t *testing.T) {
	tr := newTestTransport(t, Config{})
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: []byte("p")}, 8)
	require.NoError(t, err)
	err = tr.Publish(context.Background(), []*driver.Envelope{env})
	var pe *driver.PublishError
	require.False(t, errors.As(err, &pe), "a dial failure is not a per-message failure: %v", err)
	require.ErrorContains(t, err, "rabbitmqtransport: dial: no broker in unit tests")
	require.Error(t, tr.Ping(context.Background()))
	require.NoError(t, tr.Close())
	require.NoError(t, tr.Close(), "closing twice is a no-op")
	require.ErrorIs(t, tr.Publish(context.Background(), []*driver.Envelope{env}), outbox.ErrClosed)
}

// delivery turns what encode built into the delivery a consumer would receive.
func delivery(pub amqp.Publishing, exchange, key string) amqp.Delivery {
	return amqp.Delivery{Headers: pub.Headers, MessageId: pub.MessageId, Body: pub.Body, Exchange: exchange, RoutingKey: key}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	tr := newTestTransport(t, Config{})
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	msgs := []outbox.Message{
		{Topic: "t", Key: every[:200], Payload: every, Headers: []outbox.Header{
			{Key: "dup", Value: []byte("first")},
			{Key: "empty", Value: []byte{}},
			{Key: "dup", Value: []byte("second")},
			{Key: "binary", Value: every},
			{Key: "dup", Value: []byte("third")},
		}},
		{Topic: "t", Payload: []byte("keyless")},
		{Topic: "t", Key: []byte{}, Payload: []byte{}},
		{Topic: "t", Key: []byte("tomb"), Payload: nil},
	}
	for _, m := range msgs {
		env, err := driver.NewEnvelope(m, 8)
		require.NoError(t, err)
		ex, rk := tr.cfg.Route(env)
		pub, err := tr.encode(env, ex, rk, 131072)
		require.NoError(t, err)
		require.NoError(t, pub.Headers.Validate())
		require.Equal(t, env.ID.String(), pub.MessageId)
		require.Equal(t, amqp.Persistent, pub.DeliveryMode)

		d, err := Decode(delivery(pub, ex, rk))
		require.NoError(t, err)
		require.Equal(t, env.ID, d.ID)
		require.Equal(t, "t", d.Topic)
		require.True(t, bytes.Equal(env.Key, d.Key))
		require.Equal(t, env.Key == nil, d.Key == nil, "nil and empty keys stay distinct")
		require.True(t, bytes.Equal(env.Payload, d.Payload))
		require.Equal(t, env.Payload == nil, d.Payload == nil, "a tombstone stays distinct from an empty payload")
		want := append(append([]outbox.Header{}, env.Headers...),
			outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(env.ID.String())},
			outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte(env.ID.String())})
		require.Equal(t, len(want), len(d.Headers))
		for i := range want {
			require.Equal(t, want[i].Key, d.Headers[i].Key, "header %d", i)
			require.True(t, bytes.Equal(want[i].Value, d.Headers[i].Value), "header %d", i)
		}
	}
}

func TestEncodeRefusals(t *testing.T) {
	tr := newTestTransport(t, Config{MaxMessageSize: 100, OmitIdempotencyKey: true})
	cases := []struct {
		name string
		msg  outbox.Message
		want error
		text string
	}{
		{"too large", outbox.Message{Topic: "t", Payload: make([]byte, 101)}, outbox.ErrTooLarge, "Config.MaxMessageSize"},
		{"long routing key", outbox.Message{Topic: "t", Key: make([]byte, 256)}, outbox.ErrInvalidMessage, "Config.Route"},
		{"reserved header", outbox.Message{Topic: "t", Headers: []outbox.Header{{Key: HeaderKey}}}, outbox.ErrInvalidMessage, "rename"},
		{"long header name", outbox.Message{Topic: "t", Headers: []outbox.Header{{Key: strings.Repeat("h", 256)}}}, outbox.ErrInvalidMessage, "header name"},
	}
	big := newTestTransport(t, Config{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env, err := driver.NewEnvelope(tc.msg, 8)
			require.NoError(t, err)
			tr := tr
			if tc.name != "too large" {
				tr = big
			}
			ex, rk := tr.cfg.Route(env)
			_, err = tr.encode(env, ex, rk, 131072)
			require.ErrorIs(t, err, tc.want)
			require.True(t, driver.IsPermanent(err))
			require.ErrorContains(t, err, tc.text)
		})
	}
	// Headers that do not fit the connection's frame.
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Headers: []outbox.Header{{Key: "h", Value: make([]byte, 5000)}}}, 8)
	require.NoError(t, err)
	_, err = big.encode(env, "t", "", 4096)
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	require.ErrorContains(t, err, "frame size of 4096")
}

func TestDecodeRefusesForeignMessage(t *testing.T) {
	_, err := Decode(amqp.Delivery{Exchange: "x", Body: []byte("hi"), Headers: amqp.Table{"a": "b"}})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorContains(t, err, outbox.HeaderMessageID)
}
