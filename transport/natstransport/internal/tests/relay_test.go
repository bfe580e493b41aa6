package tests

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// relayHarness runs the transport under the relay suite. The stream's duplicate
// window drops a republished message. With PipelineKeys a key's order holds only
// while nothing fails, so the suite checks it only there (the transport keeps key
// order). The limit leaves room for a few plain headers (in name order, they travel
// as NATS headers).
func relayHarness(pipeline bool) relaysuite.Harness {
	rs := &relayStreams{pipeline: pipeline, readers: map[string]*reader{}, streams: map[string]jetstream.Stream{}}
	return relaysuite.Harness{
		New:     rs.transport,
		Read:    rs.read,
		Raw:     rawPublish,
		Source:  rs.source,
		Foreign: rs.foreign,
		Settled: rs.settled,
		Features: relaysuite.Features{
			Ordered: !pipeline, Deduplicates: true, Proxy: true,
			Pinger: true, KeepsKeyOrder: pipeline, SizeLimiter: true,
			IdempotencyKey: true, HeadersAtLimit: 8,
		},
	}
}

// relayStreams gives each topic of the relay suite a subject with a memory stream of
// its own, and reads it back from the start.
type relayStreams struct {
	pipeline bool

	mu      sync.Mutex
	readers map[string]*reader
	streams map[string]jetstream.Stream
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
		rs.streams[topic] = s
	}
	return newTransport(tb, js, cfg)
}

func (rs *relayStreams) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	rs.mu.Lock()
	r := rs.readers[topic]
	rs.mu.Unlock()
	return received(r.read(tb, n))
}

func (rs *relayStreams) stream(topic string) jetstream.Stream {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.streams[topic]
}

// source reads topic's stream through a durable consumer "billing" (the same one
// when called again). What a stopped consumer left unacknowledged comes again after
// a 10 s AckWait, not the default 30 s.
func (rs *relayStreams) source(tb testing.TB, topic string) inbox.Source {
	cons, err := rs.stream(topic).CreateOrUpdateConsumer(context.Background(), jetstream.ConsumerConfig{
		Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second,
	})
	require.NoError(tb, err)
	src, err := natstransport.NewSource(cons, natstransport.SourceConfig{})
	require.NoError(tb, err)
	return src
}

func (rs *relayStreams) foreign(tb testing.TB, topic string) {
	nc, _ := connect(tb, natsURL())
	require.NoError(tb, nc.Publish(topic, []byte("not from the outbox")))
	require.NoError(tb, nc.Flush())
}

// settled requires every message the consumer "billing" was given to be
// acknowledged or terminated.
func (rs *relayStreams) settled(tb testing.TB, topic string) {
	cons, err := rs.stream(topic).Consumer(context.Background(), "billing")
	require.NoError(tb, err)
	info, err := cons.Info(context.Background())
	require.NoError(tb, err)
	assert.Zero(tb, info.NumAckPending, "every message settled (acknowledged, or terminated)")
	assert.Zero(tb, info.NumPending)
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
