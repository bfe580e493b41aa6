package rabbitmqtransport

import (
	"bytes"
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// FuzzRoundTrip: any message capture accepts is encoded and decoded back byte for
// byte — key (nil and empty apart), payload (tombstone and empty apart), headers in
// order with repeats — or refused permanently before sending.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("k"), []byte("v"), "a", []byte("1"), "a", []byte{0xff}, false)
	f.Add([]byte{}, []byte(nil), "x-outbox-key", []byte{}, "b", []byte(nil), true)
	f.Add([]byte(nil), []byte{}, "idempotency-key", []byte("mine"), "x-outbox-message-id", []byte("not an id"), false)
	tr, err := New(func(ctx context.Context) (*amqp.Connection, error) { return nil, errors.New("unused") }, Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key, payload []byte, n1 string, v1 []byte, n2 string, v2 []byte, nilKey bool) {
		if nilKey {
			key = nil
		}
		msg := outbox.Message{Topic: "t", Key: key, Payload: payload, Headers: []outbox.Header{{Key: n1, Value: v1}, {Key: n2, Value: v2}}}
		env, err := driver.NewEnvelope(msg, 8)
		if err != nil {
			return // capture refuses it
		}
		ex, rk := tr.cfg.Route(env)
		pub, err := tr.encode(env, ex, rk, 131072)
		if err != nil {
			if !driver.IsPermanent(err) || !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("a refusal is permanent and wraps ErrInvalidMessage: %v", err)
			}
			return
		}
		if err := pub.Headers.Validate(); err != nil {
			t.Fatalf("the table is not valid AMQP: %v", err)
		}
		d, err := Decode(amqp.Delivery{Headers: pub.Headers, Body: pub.Body, Exchange: ex, RoutingKey: rk, MessageId: pub.MessageId})
		if err != nil {
			// Only an application header that claims the message-id name with a value
			// that is not a UUID may spoil the id.
			if errors.Is(err, outbox.ErrInvalidMessage) && (n1 == outbox.HeaderMessageID || n2 == outbox.HeaderMessageID) {
				return
			}
			t.Fatalf("decode: %v", err)
		}
		if d.Topic != "t" || !bytes.Equal(d.Key, key) || (d.Key == nil) != (key == nil) || !bytes.Equal(d.Payload, payload) || (d.Payload == nil) != (payload == nil) {
			t.Fatalf("key or payload changed: %q/%q, want %q/%q", d.Key, d.Payload, key, payload)
		}
		if len(d.Headers) < 2 || d.Headers[0].Key != n1 || !bytes.Equal(d.Headers[0].Value, v1) || d.Headers[1].Key != n2 || !bytes.Equal(d.Headers[1].Value, v2) {
			t.Fatalf("headers changed: %q", d.Headers)
		}
	})
}
