package tests

import (
	"sync"
	"testing"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/redistransport"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	const maxSize = 64 << 10
	client := connect(t, redisAddr())
	var (
		mu      sync.Mutex
		readers = map[string]*reader{}
	)
	outboxtest.RunTransportTests(t, outboxtest.TransportHarness{
		New: func(t *testing.T, topics ...string) driver.Transport {
			t.Cleanup(func() { deleteKeys(client, topics...) })
			return newTransport(t, client, redistransport.Config{MaxMessageSize: maxSize})
		},
		Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
			mu.Lock()
			r := readers[topic]
			if r == nil {
				r = newReader(client, topic)
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
}
