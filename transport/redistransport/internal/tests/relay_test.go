package tests

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// relayHarness runs the transport under the relay suite, with a 64 KiB limit (below
// the memory store's, so the suite's capture subtest runs).
func relayHarness() relaysuite.Harness {
	rs := &relayStreams{readers: map[string]*reader{}}
	return relaysuite.Harness{
		New:     rs.transport,
		Read:    rs.read,
		Raw:     rawPublish,
		Source:  rs.source,
		Foreign: rs.foreign,
		Settled: rs.settled,
		Features: relaysuite.Features{
			Ordered: true, Proxy: true, Pinger: true, KeepsKeyOrder: true, SizeLimiter: true,
			IdempotencyKey: true, HeadersAtLimit: 28,
		},
	}
}

// relayStreams gives each topic of the relay suite a stream of its own, deleted at
// cleanup and read back from the start.
type relayStreams struct {
	mu      sync.Mutex
	readers map[string]*reader
}

// transport connects a client of its own, through dial when it is set: then it
// gives up on a connection that answers nothing within a second. Clients do no
// retries of their own: the relay retries.
func (rs *relayStreams) transport(tb testing.TB, topic string, dial func(string) string) driver.Transport {
	var client *redis.Client
	if dial == nil {
		client = connect(tb, redisAddr())
	} else {
		client = connect(tb, dial(redisAddr()), func(o *redis.Options) {
			o.ReadTimeout, o.WriteTimeout = time.Second, time.Second
		})
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.readers[topic] == nil {
		direct := connect(tb, redisAddr())
		tb.Cleanup(func() { deleteKeys(direct, topic) })
		rs.readers[topic] = newReader(direct, topic)
	}
	return newTransport(tb, client, redistransport.Config{MaxMessageSize: 64 << 10})
}

func (rs *relayStreams) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	rs.mu.Lock()
	r := rs.readers[topic]
	rs.mu.Unlock()
	var out []outboxtest.Received
	for _, d := range r.read(tb, n) {
		out = append(out, outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers})
	}
	return out
}

// source reads topic as the consumer "billing-1" of a group "billing" made at the
// stream's start (by the first call).
func (rs *relayStreams) source(tb testing.TB, topic string) inbox.Source {
	client := connect(tb, redisAddr())
	if err := client.XGroupCreateMkStream(context.Background(), topic, "billing", "0").Err(); err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		require.NoError(tb, err)
	}
	src, err := redistransport.NewSource(client, redistransport.SourceConfig{Stream: topic, Group: "billing", Name: "billing-1"})
	require.NoError(tb, err)
	return src
}

func (rs *relayStreams) foreign(tb testing.TB, topic string) {
	client := connect(tb, redisAddr())
	require.NoError(tb, client.XAdd(context.Background(), &redis.XAddArgs{Stream: topic, Values: []any{"payload", "not from the outbox"}}).Err())
}

func (rs *relayStreams) settled(tb testing.TB, topic string) {
	client := connect(tb, redisAddr())
	pending, err := client.XPending(context.Background(), topic, "billing").Result()
	require.NoError(tb, err)
	assert.Zero(tb, pending.Count, "every entry acknowledged")
}

func TestRelay(t *testing.T) {
	t.Parallel()
	relaysuite.Run(t, relayHarness())
}
