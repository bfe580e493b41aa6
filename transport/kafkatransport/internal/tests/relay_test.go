package tests

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	rc := &relayClusters{clusters: map[string]*kfake.Cluster{}, consumers: map[string]*consumer{}}
	return relaysuite.Harness{
		New:      rc.transport,
		Read:     rc.read,
		Raw:      rawProduce,
		Source:   rc.source,
		Foreign:  rc.foreign,
		Features: relaysuite.Features{Ordered: true, Proxy: true, Pinger: true, KeepsKeyOrder: true, SizeLimiter: true, PublishTimeouter: true},
	}
}

// relayClusters gives each topic of the relay suite an in-process three-broker
// cluster of its own, with a partition per outbox bucket.
type relayClusters struct {
	mu        sync.Mutex
	clusters  map[string]*kfake.Cluster
	consumers map[string]*consumer
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

// source reads topic from its start in a consumer group of its own.
func (rc *relayClusters) source(tb testing.TB, topic string) inbox.Source {
	src, err := kafkatransport.NewSource(groupClient(tb, rc.cluster(topic), "billing", topic), kafkatransport.SourceConfig{})
	require.NoError(tb, err)
	return src
}

// foreign produces a record with no key and no outbox headers.
func (rc *relayClusters) foreign(tb testing.TB, topic string) {
	require.NoError(tb, newClient(tb, rc.cluster(topic)).ProduceSync(context.Background(), &kgo.Record{Topic: topic, Value: []byte("foreign")}).FirstErr())
}

func TestRelay(t *testing.T) {
	t.Parallel()
	relaysuite.Run(t, relayHarness())
}
