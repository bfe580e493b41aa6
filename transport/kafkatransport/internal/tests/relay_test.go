package tests

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// relayHarness runs the transport under the relay suite.
func relayHarness() relaysuite.Harness {
	rc := &relayClusters{clusters: map[string]*kfake.Cluster{}, consumers: map[string]*consumer{}, groups: map[string]*kgo.Client{}}
	return relaysuite.Harness{
		New:     rc.transport,
		Read:    rc.read,
		Raw:     rawProduce,
		Source:  rc.source,
		Foreign: rc.foreign,
		Settled: rc.settled,
		Features: relaysuite.Features{
			Ordered: true, Proxy: true, ReconnectBackoff: true, Pinger: true, KeepsKeyOrder: true, SizeLimiter: true, PublishTimeouter: true,
			IdempotencyKey: true, HeadersAtLimit: 28,
		},
	}
}

// relayClusters gives each topic of the relay suite an in-process three-broker
// cluster of its own, with a partition per outbox bucket.
type relayClusters struct {
	mu        sync.Mutex
	clusters  map[string]*kfake.Cluster
	consumers map[string]*consumer
	groups    map[string]*kgo.Client // the group client of each topic's last source
}

// transport builds a client of its own. Through dial, when it is set, the client
// reaches every broker (kgo.Dialer) and gives up on a batch the brokers do not
// acknowledge within a second.
func (rc *relayClusters) transport(tb testing.TB, topic string, dial func(string) string) driver.Transport {
	rc.mu.Lock()
	c := rc.clusters[topic]
	if c == nil {
		c = newCluster(tb, relaysuite.Buckets, topic)
		rc.clusters[topic] = c
		rc.consumers[topic] = newConsumer(tb, c, topic)
	}
	rc.mu.Unlock()
	if dial == nil {
		return newTransport(tb, c, kafkatransport.Config{AckTimeout: 3 * time.Second})
	}
	viaProxy := kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, dial(host))
	})
	return newTransport(tb, c, kafkatransport.Config{AckTimeout: time.Second}, viaProxy)
}

// read consumes the topic from its start and checks that every keyed message landed
// on its bucket's partition.
func (rc *relayClusters) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	rc.mu.Lock()
	cs := rc.consumers[topic]
	rc.mu.Unlock()
	var out []outboxtest.Received
	for _, d := range decodeAll(tb, cs.read(tb, n)) {
		if d.Key != nil {
			bucket := driver.BucketOf(&outbox.Message{Key: d.Key}, relaysuite.Buckets)
			require.Equal(tb, int32(bucket), *d.Partition, "key %q left its bucket's partition", d.Key)
		}
		out = append(out, outboxtest.Received{ID: d.ID.String(), Topic: d.Topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers})
	}
	return out
}

func (rc *relayClusters) cluster(topic string) *kfake.Cluster {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.clusters[topic]
}

// source reads topic from its start in the consumer group "billing". Called again,
// it closes the last source's client first, which leaves the group, so the new one
// is given every partition from the committed offsets.
func (rc *relayClusters) source(tb testing.TB, topic string) inbox.Source {
	rc.mu.Lock()
	last := rc.groups[topic]
	rc.mu.Unlock()
	if last != nil {
		last.Close()
	}
	cl := groupClient(tb, rc.cluster(topic), "billing", topic)
	rc.mu.Lock()
	rc.groups[topic] = cl
	rc.mu.Unlock()
	src, err := kafkatransport.NewSource(cl, kafkatransport.SourceConfig{})
	require.NoError(tb, err)
	return src
}

// settled requires the group "billing" to have committed every partition of topic
// up to its end: every record processed, skipped or found a duplicate.
func (rc *relayClusters) settled(tb testing.TB, topic string) {
	adm := kadm.NewClient(newClient(tb, rc.cluster(topic)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := adm.ListEndOffsets(ctx, topic)
	require.NoError(tb, err)
	committed, err := adm.FetchOffsets(ctx, "billing")
	require.NoError(tb, err)
	ends.Each(func(end kadm.ListedOffset) {
		require.NoError(tb, end.Err)
		if end.Offset <= 0 {
			return
		}
		c, ok := committed.Lookup(topic, end.Partition)
		require.True(tb, ok, "partition %d holds %d records and nothing is committed", end.Partition, end.Offset)
		require.NoError(tb, c.Err)
		assert.Equal(tb, end.Offset, c.At, "partition %d is committed up to its end", end.Partition)
	})
}

// foreign produces a record with no key and no outbox headers.
func (rc *relayClusters) foreign(tb testing.TB, topic string) {
	require.NoError(tb, newClient(tb, rc.cluster(topic)).ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: []byte("foreign")}).FirstErr())
}

func TestRelay(t *testing.T) {
	t.Parallel()
	relaysuite.Run(t, relayHarness())
}
