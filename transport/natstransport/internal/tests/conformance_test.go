package tests

import (
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/natstransport"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	const maxSize = 64 << 10
	_, js := connect(t, natsURL())
	var (
		mu      sync.Mutex
		streams = map[string]jetstream.Stream{}
		readers = map[string]*reader{}
	)
	for _, pipeline := range []bool{false, true} {
		name := "OneMessagePerKey"
		if pipeline {
			name = "PipelineKeys"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunTransportTests(t, outboxtest.TransportHarness{
				New: func(t *testing.T, topics ...string) driver.Transport {
					s := createStream(t, js, jetstream.StreamConfig{Subjects: topics})
					mu.Lock()
					for _, topic := range topics {
						streams[topic] = s
					}
					mu.Unlock()
					return newTransport(t, js, natstransport.Config{MaxMessageSize: maxSize, PipelineKeys: pipeline})
				},
				Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
					mu.Lock()
					s, r := streams[topic], readers[topic]
					if r == nil {
						require.NotNil(t, s, "topic %s was not made by New", topic)
						r = newReader(t, s, topic)
						readers[topic] = r
					}
					mu.Unlock()
					out := make([]outboxtest.Received, n)
					for i, d := range r.read(t, n) {
						out[i] = outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers}
					}
					return out
				},
				MaxMessageSize: maxSize,
				Ordered:        true,
			})
		})
	}
}
