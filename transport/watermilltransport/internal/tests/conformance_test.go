package tests

import (
	"testing"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

const conformanceMaxSize = 64 << 10

// The conformance suite through Watermill's AMQP publisher (durable queues, delivery
// confirmation) against the real broker; messages are read back through the
// adapter's marshaler, as a Watermill subscriber would see them.
func TestConformance(t *testing.T) {
	needBroker(t)
	outboxtest.RunTransportTests(t, outboxtest.TransportHarness{
		New: func(t *testing.T, topics ...string) driver.Transport {
			a := newAdmin(t)
			for _, topic := range topics {
				a.queue(t, topic, nil)
			}
			return newTransport(t, publisher(t, ""), watermilltransport.Config{MaxMessageSize: conformanceMaxSize})
		},
		Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
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
