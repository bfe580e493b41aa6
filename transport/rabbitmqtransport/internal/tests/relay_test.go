package tests

import (
	"net/url"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// relayHarness runs the transport under the relay suite.
func relayHarness() relaysuite.Harness {
	rt := &relayTopics{declared: map[string]bool{}}
	return relaysuite.Harness{
		New:     rt.transport,
		Read:    rt.read,
		Raw:     rawPublisher,
		Source:  rt.source,
		Foreign: rt.foreign,
		Settled: rt.settled,
		Features: relaysuite.Features{
			Ordered: true, Proxy: true, Pinger: true, SizeLimiter: true,
			IdempotencyKey: true, HeadersAtLimit: 28,
		},
	}
}

// relayTopics gives each topic of the relay suite a fanout exchange with one durable
// queue of the same name, routed by topic alone: the conformance suite's keys go past
// AMQP's 255-byte routing keys (the key still travels, in
// rabbitmqtransport.HeaderKey; TestDefaultRoute covers the default route).
type relayTopics struct {
	mu       sync.Mutex
	declared map[string]bool
}

// transport dials the broker, through dial when it is set. The connections' 2 s
// heartbeat gives up on one that forwards nothing within seconds, and a confirm
// that does not come within 2 s fails the call. Its 64 KiB limit keeps the suite's
// messages at the limit small (the default is the broker's 16 MiB).
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
		MaxMessageSize: 64 << 10,
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

// consumeQueue is the queue of topic's exchange that the Consume subtest's source
// reads.
func consumeQueue(topic string) string { return topic + ".consume" }

func (rt *relayTopics) source(tb testing.TB, topic string) inbox.Source {
	newAdmin(tb).queue(tb, consumeQueue(topic), topic, "", nil)
	src, err := rabbitmqtransport.NewSource(dialer(""), rabbitmqtransport.SourceConfig{Queue: consumeQueue(topic)})
	require.NoError(tb, err)
	return src
}

func (rt *relayTopics) foreign(tb testing.TB, topic string) {
	require.NoError(tb, newAdmin(tb).ch.Publish(topic, "", false, false, amqp.Publishing{Body: []byte("not from the outbox")}))
}

// settled requires the source's queue to be empty: every message acknowledged or
// rejected.
func (rt *relayTopics) settled(tb testing.TB, topic string) {
	assert.Zero(tb, newAdmin(tb).depth(tb, consumeQueue(topic)), "every message settled")
}

func TestRelay(t *testing.T) {
	needBroker(t)
	relaysuite.Run(t, relayHarness())
}
