package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// newCluster starts an in-process three-broker Kafka with the given topics created.
func newCluster(t testing.TB, partitions int32, topics ...string) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3), kfake.SeedTopics(partitions, topics...))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// newClient builds a producer client for c, closed at cleanup.
func newClient(t testing.TB, c *kfake.Cluster, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// newTransport builds a transport on a fresh client for c.
func newTransport(t testing.TB, c *kfake.Cluster, cfg kafkatransport.Config, opts ...kgo.Opt) *kafkatransport.Transport {
	t.Helper()
	tr, err := kafkatransport.New(newClient(t, c, opts...), cfg)
	require.NoError(t, err)
	return tr
}

// consumer reads one topic from its start.
type consumer struct {
	client  *kgo.Client
	pending []*kgo.Record
}

func newConsumer(t testing.TB, c *kfake.Cluster, topic string) *consumer {
	t.Helper()
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return &consumer{client: cl}
}

// read returns the next n records, failing the test if they do not arrive within
// ten seconds.
func (cs *consumer) read(t testing.TB, n int) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(cs.pending) < n {
		fetches := cs.client.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d records, got %d before timeout", n, len(cs.pending))
		}
		fetches.EachError(func(topic string, p int32, err error) {
			t.Fatalf("fetch %s/%d: %v", topic, p, err)
		})
		cs.pending = append(cs.pending, fetches.Records()...)
	}
	out := cs.pending[:n:n]
	cs.pending = cs.pending[n:]
	return out
}

// readAll returns every record the topic holds (it has at least min), waiting a short
// while for stragglers.
func (cs *consumer) readAll(t testing.TB, min int) []*kgo.Record {
	t.Helper()
	recs := cs.read(t, min)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	for {
		fetches := cs.client.PollFetches(ctx)
		if ctx.Err() != nil {
			return append(recs, cs.pending...)
		}
		cs.pending = append(cs.pending, fetches.Records()...)
	}
}

// envelope builds an envelope for tests, failing on invalid input.
func envelope(t testing.TB, msg outbox.Message) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(msg, driver.DefaultBucketCount)
	require.NoError(t, err)
	return env
}

func decodeAll(t testing.TB, recs []*kgo.Record) []kafkatransport.Delivery {
	t.Helper()
	out := make([]kafkatransport.Delivery, len(recs))
	for i, r := range recs {
		d, err := kafkatransport.Decode(r)
		require.NoError(t, err)
		out[i] = d
	}
	return out
}
