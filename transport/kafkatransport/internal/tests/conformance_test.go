package tests

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	const maxSize = 64 << 10
	var (
		mu       sync.Mutex
		clusters = map[string]*kfake.Cluster{}
		readers  = map[string]*consumer{}
	)
	outboxtest.RunTransportTests(t, outboxtest.TransportHarness{
		New: func(t *testing.T, topics ...string) driver.Transport {
			c := newCluster(t, 4, topics...)
			mu.Lock()
			for _, topic := range topics {
				clusters[topic] = c
			}
			mu.Unlock()
			return newTransport(t, c, kafkatransport.Config{MaxMessageSize: maxSize})
		},
		Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
			mu.Lock()
			c, cs := clusters[topic], readers[topic]
			if cs == nil {
				require.NotNil(t, c, "topic %s was not made by New", topic)
				cs = newConsumer(t, c, topic)
				readers[topic] = cs
			}
			mu.Unlock()
			out := make([]outboxtest.Received, n)
			for i, d := range decodeAll(t, cs.read(t, n)) {
				out[i] = outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers}
			}
			return out
		},
		MaxMessageSize: maxSize,
		Ordered:        true,
	})
}
