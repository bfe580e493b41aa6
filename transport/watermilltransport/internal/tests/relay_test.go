package tests

import (
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// relayHarness runs the transport under the relay suite. Watermill's AMQP adapter
// (watermill-amqp v3.0.2) reassigns the channel behind
// ConnectionWrapper.IsConnected from its reconnection goroutine without
// synchronisation while every Publish reads it, so the race detector reports that
// data race inside the adapter during any outage: the suite's outage subtests run in
// builds without -race only (go test -count=1 ./internal/tests/ in this module).
func relayHarness() relaysuite.Harness {
	rq := &relayQueues{declared: map[string]bool{}}
	return relaysuite.Harness{
		New:  rq.transport,
		Read: rq.read,
		Raw:  rawPublish,
		Features: relaysuite.Features{
			Ordered: true, Proxy: true, ReconnectRaces: true, Pinger: true, KeepsKeyOrder: true, SizeLimiter: true,
			IdempotencyKey: true, HeadersAtLimit: 28,
		},
	}
}

// relayQueues gives each topic of the relay suite a durable queue of its own,
// published to through Watermill's AMQP publisher (delivery confirmation) and read
// back through the adapter's marshaler.
type relayQueues struct {
	mu       sync.Mutex
	declared map[string]bool
}

// transport builds a publisher of its own, through dial when it is set. Watermill's
// publisher reconnects by itself; Config.Ping reports its connection state. The
// transport's 64 KiB limit stands for what the broker takes less the metadata
// (Watermill's publisher has none of its own).
func (rq *relayQueues) transport(tb testing.TB, topic string, dial func(string) string) driver.Transport {
	addr := ""
	if dial != nil {
		u, err := url.Parse(amqpURL())
		require.NoError(tb, err)
		addr = dial(u.Host)
	}
	pub := publisher(tb, addr)
	rq.mu.Lock()
	if !rq.declared[topic] {
		newAdmin(tb).queue(tb, topic, nil)
		rq.declared[topic] = true
	}
	rq.mu.Unlock()
	return newTransport(tb, pub, watermilltransport.Config{MaxMessageSize: 64 << 10})
}

// read takes n messages off the topic's queue, on a connection of its own, as a
// Watermill subscriber would see them.
func (*relayQueues) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	got := newAdmin(tb).read(tb, topic, n)
	out := make([]outboxtest.Received, 0, n)
	for _, d := range got {
		out = append(out, outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers})
	}
	return out
}

func TestRelay(t *testing.T) {
	needBroker(t)
	relaysuite.Run(t, relayHarness())
}
