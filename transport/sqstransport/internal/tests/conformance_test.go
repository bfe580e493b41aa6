package tests

import (
	"sync"
	"testing"

	"github.com/outboxkit/outbox/driver"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// harness adapts the transport to the conformance suite: every topic gets a queue of
// its own (a FIFO queue named after the topic plus ".fifo" when fifo is set).
func harness(t *testing.T, fifo bool) outboxtest.TransportHarness {
	var queues sync.Map // topic → queue URL
	return outboxtest.TransportHarness{
		New: func(t *testing.T, topics ...string) driver.Transport {
			srv := emulator.Shared(t)
			static := sqstransport.Queues{}
			for _, topic := range topics {
				name := topic
				if fifo {
					name += ".fifo"
				}
				url := srv.CreateQueue(t, name, nil)
				static[topic] = url
				queues.Store(topic, url)
			}
			return newTransport(t, srv.Client(), sqstransport.Config{Resolver: static})
		},
		Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
			url, ok := queues.Load(topic)
			if !ok {
				t.Fatalf("topic %s was never created", topic)
			}
			got, _ := receive(t, emulator.Shared(t).Client(), url.(string), n)
			out := make([]outboxtest.Received, len(got))
			for i, d := range got {
				out[i] = outboxtest.Received{ID: d.ID.String(), Topic: topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers}
			}
			return out
		},
		MaxMessageSize: offlineTransport(t, sqstransport.Config{}).MaxMessageSize(),
		Ordered:        fifo,
	}
}

func TestConformanceStandardQueue(t *testing.T) {
	t.Parallel()
	outboxtest.RunTransportTests(t, harness(t, false))
}

func TestConformanceFIFOQueue(t *testing.T) {
	t.Parallel()
	outboxtest.RunTransportTests(t, harness(t, true))
}
