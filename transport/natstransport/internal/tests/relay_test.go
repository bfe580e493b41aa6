package tests

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// relayHarness runs the transport under the relay suite. The stream's duplicate
// window drops a republished message. With PipelineKeys a key's order holds only
// while nothing fails, so the suite does not check it.
func relayHarness(pipeline bool) relaysuite.Harness {
	rs := &relayStreams{pipeline: pipeline, readers: map[string]*reader{}}
	return relaysuite.Harness{
		New:      rs.transport,
		Read:     rs.read,
		Raw:      rawPublish,
		Features: relaysuite.Features{Ordered: !pipeline, Deduplicates: true, Proxy: true},
	}
}

// relayStreams gives each topic of the relay suite a subject with a memory stream of
// its own, and reads it back from the start.
type relayStreams struct {
	pipeline bool

	mu      sync.Mutex
	readers map[string]*reader
}

// transport connects to the server, through dial when it is set: then the
// connection reconnects at once and pings every half second, so one that forwards
// nothing is given up within about a second, and a publish waits at most a second
// for its acknowledgements.
func (rs *relayStreams) transport(tb testing.TB, topic string, dial func(string) string) driver.Transport {
	url, opts := natsURL(), []nats.Option(nil)
	cfg := natstransport.Config{PipelineKeys: rs.pipeline}
	if dial != nil {
		url = "nats://" + dial(hostPort(natsURL()))
		opts = []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond),
			nats.PingInterval(500 * time.Millisecond), nats.MaxPingsOutstanding(2)}
		cfg.AckTimeout = time.Second
	}
	_, js := connect(tb, url, opts...)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.readers[topic] == nil {
		_, direct := connect(tb, natsURL())
		s := createStream(tb, direct, jetstream.StreamConfig{Subjects: []string{topic}})
		rs.readers[topic] = newReader(tb, s, topic)
	}
	return newTransport(tb, js, cfg)
}

func (rs *relayStreams) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	rs.mu.Lock()
	r := rs.readers[topic]
	rs.mu.Unlock()
	return received(r.read(tb, n))
}

// received is how the suites see deliveries.
func received(ds []natstransport.Delivery) []outboxtest.Received {
	out := make([]outboxtest.Received, len(ds))
	for i, d := range ds {
		out[i] = outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers}
	}
	return out
}

func TestRelay(t *testing.T) {
	t.Parallel()
	for _, pipeline := range []bool{false, true} {
		name := "OneMessagePerKey"
		if pipeline {
			name = "PipelineKeys"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			relaysuite.Run(t, relayHarness(pipeline))
		})
	}
}
