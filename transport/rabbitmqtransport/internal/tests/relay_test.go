package tests

import (
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// relayHarness runs the transport under the relay suite.
func relayHarness() relaysuite.Harness {
	rt := &relayTopics{declared: map[string]bool{}}
	return relaysuite.Harness{
		New:      rt.transport,
		Read:     rt.read,
		Raw:      rawPublisher,
		Features: relaysuite.Features{Ordered: true, Proxy: true},
	}
}

// relayTopics gives each topic of the relay suite a fanout exchange with one durable
// queue of the same name, routed by topic alone (as in the conformance suite).
type relayTopics struct {
	mu       sync.Mutex
	declared map[string]bool
}

// transport dials the broker, through dial when it is set. The connections' 2 s
// heartbeat gives up on one that forwards nothing within seconds, and a confirm
// that does not come within 2 s fails the call.
func (rt *relayTopics) transport(tb testing.TB, topic string, dial func(string) string) driver.Transport {
	rt.mu.Lock()
	if !rt.declared[topic] {
		a := newAdmin(tb)
		a.exchange(tb, topic, amqp.ExchangeFanout)
		a.queue(tb, topic, topic, "", nil)
		rt.declared[topic] = true
	}
	rt.mu.Unlock()
	addr := ""
	if dial != nil {
		u, err := url.Parse(amqpURL())
		require.NoError(tb, err)
		addr = dial(u.Host)
	}
	return newTransport(tb, addr, rabbitmqtransport.Config{
		ConfirmTimeout: 2 * time.Second,
		Route:          func(env *driver.Envelope) (string, string) { return env.Topic, "" },
	})
}

// read takes n messages off the topic's queue, on a connection of its own.
func (*relayTopics) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	var out []outboxtest.Received
	for _, d := range newAdmin(tb).read(tb, topic, n) {
		out = append(out, outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers})
	}
	return out
}

func TestRelay(t *testing.T) {
	needBroker(t)
	relaysuite.Run(t, relayHarness())
}
