package tests

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

const conformanceMaxSize = 64 << 10

// The conformance suite against the real broker. Each topic is a fanout exchange with
// one durable queue of the same name. The suite's keys go past AMQP's 255-byte routing
// keys, so the harness routes by topic alone (the key still travels, in
// rabbitmqtransport.HeaderKey); TestDefaultRoute covers the default route.
func TestConformance(t *testing.T) {
	needBroker(t)
	outboxtest.RunTransportTests(t, outboxtest.TransportHarness{
		New: func(t *testing.T, topics ...string) driver.Transport {
			a := newAdmin(t)
			for _, topic := range topics {
				a.exchange(t, topic, amqp.ExchangeFanout)
				a.queue(t, topic, topic, "", nil)
			}
			return newTransport(t, "", rabbitmqtransport.Config{
				MaxMessageSize: conformanceMaxSize,
				Route:          func(env *driver.Envelope) (string, string) { return env.Topic, "" },
			})
		},
		Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
			// A connection per read: an AMQP channel's synchronous calls must not
			// interleave across the suite's parallel subtests.
			got := newAdmin(t).read(t, topic, n)
			out := make([]outboxtest.Received, len(got))
			for i, d := range got {
				out[i] = outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers}
			}
			return out
		},
		MaxMessageSize: conformanceMaxSize,
		Ordered:        true,
	})
}
