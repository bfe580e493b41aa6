package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// keyBatch is n messages of one key for one partition.
func keyBatch(t *testing.T, topic, key string, partition int32, n int) []*driver.Envelope {
	var batch []*driver.Envelope
	for i := range n {
		batch = append(batch, envelope(t, outbox.Message{Topic: topic, Key: []byte(key), Partition: ptr(partition), Payload: fmt.Appendf(nil, "%s-%d", key, i)}))
	}
	return batch
}

// cutSetup is a one-broker cluster with two partitions behind a proxy, and two
// transports on one client that sends one produce request at a time: patient
// (AckTimeout 5 min) and hasty (300 ms).
func cutSetup(t *testing.T, topic string) (c *kfake.Cluster, p *netProxy, patient, hasty *kafkatransport.Transport) {
	c = newCluster(t, 2, topic)
	p = newProxy(t, c)
	opts := append(p.clientOpts(c), kgo.MaxProduceRequestsInflightPerBroker(1), kgo.RecordPartitioner(kafkatransport.Partitioner(nil)))
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	patient, err = kafkatransport.New(cl, kafkatransport.Config{AckTimeout: 5 * time.Minute})
	require.NoError(t, err)
	hasty, err = kafkatransport.New(cl, kafkatransport.Config{AckTimeout: 300 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, patient.Publish(context.Background(), append(keyBatch(t, topic, "warm", 0, 1), keyBatch(t, topic, "warm", 1, 1)...)))
	return c, p, patient, hasty
}

// waitQueued waits until the proxy holds bytes in its hole: a produce request is on
// the wire.
func waitQueued(t *testing.T, p *netProxy) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		p.mu.Lock()
		q := p.queued
		p.mu.Unlock()
		if q > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "no produce request reached the proxy")
		time.Sleep(time.Millisecond)
	}
}

// TestCutBehindARequestOnTheWireSaysTheClientMayDeliver: records buffered behind a
// request of their own partition that is on the wire cannot be withdrawn (the client
// fails a partition's records from its head, and an idempotent producer never fails
// a request it sent). Publish then says so, at AckTimeout, and those records
// may indeed arrive once the network heals.
func TestCutBehindARequestOnTheWireSaysTheClientMayDeliver(t *testing.T) {
	t.Parallel()
	c, p, patient, hasty := cutSetup(t, "behind")
	p.blackhole()
	resA := make(chan error, 1)
	go func() { resA <- patient.Publish(context.Background(), keyBatch(t, "behind", "a", 0, 2)) }()
	waitQueued(t, p)
	b := keyBatch(t, "behind", "b", 0, 2)
	var pe *driver.PublishError
	require.ErrorAs(t, hasty.Publish(context.Background(), b), &pe)
	require.Len(t, pe.Failed, len(b))
	for _, f := range pe.Failed {
		assert.False(t, driver.IsPermanent(f.Err))
		assert.Contains(t, f.Err.Error(), "may still deliver")
	}
	p.heal()
	require.NoError(t, <-resA)
	// What the client still held is delivered: the warning was true. Nothing is lost.
	cs := newConsumer(t, c, "behind")
	seen := map[uuid.UUID]bool{}
	for _, d := range decodeAll(t, cs.readAll(t, 6)) {
		seen[d.ID] = true
	}
	for _, e := range b {
		assert.True(t, seen[e.ID], "%s", e.Payload)
	}
}

// TestPingReportsAnUnreachableCluster: Ping answers while a broker does, and fails
// while every connection is black-holed.
func TestPingReportsAnUnreachableCluster(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "ping")
	p := newProxy(t, c)
	cl, err := kgo.NewClient(p.clientOpts(c)...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	tr, err := kafkatransport.New(cl, kafkatransport.Config{})
	require.NoError(t, err)
	require.NoError(t, tr.Ping(context.Background()))
	p.blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	require.Error(t, tr.Ping(ctx))
	p.heal()
	require.NoError(t, tr.Ping(context.Background()))
}
