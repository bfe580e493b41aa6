package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

func groupClient(t testing.TB, c *kfake.Cluster, group, topic string, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	return newClient(t, c, append([]kgo.Opt{
		kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100 * time.Millisecond),
	}, opts...)...)
}

// publishKeyed publishes n messages over keys keys through the transport and returns
// the ids by key in publish order.
func publishKeyed(t *testing.T, c *kfake.Cluster, topic string, n, keys int) map[string][]string {
	t.Helper()
	tr := newTransport(t, c, kafkatransport.Config{})
	byKey := map[string][]string{}
	var envs []*driver.Envelope
	for i := range n {
		key := fmt.Sprintf("key-%d", i%keys)
		env := envelope(t, outbox.Message{Topic: topic, Key: []byte(key), Payload: []byte(fmt.Sprint(i))})
		envs = append(envs, env)
		byKey[key] = append(byKey[key], fmt.Sprint(i))
	}
	require.NoError(t, tr.Publish(context.Background(), envs))
	return byKey
}

// newInboxConsumer builds the inbox's consume loop on a source over client.
func newInboxConsumer(t *testing.T, client *kgo.Client, in *inbox.Inbox, handle inbox.Handler, cfg inbox.ConsumerConfig) *inbox.Consumer {
	t.Helper()
	src, err := kafkatransport.NewSource(client, kafkatransport.SourceConfig{})
	require.NoError(t, err)
	cs, err := inbox.NewConsumer(src, in, handle, cfg)
	require.NoError(t, err)
	return cs
}

// offset is the delivered record's offset.
func offset(d *inbox.Delivery) int64 { return d.Raw.(*kgo.Record).Offset }

// committed reads the group's committed offsets of topic's partitions.
func committed(t *testing.T, c *kfake.Cluster, group, topic string, partitions int32) map[int32]int64 {
	t.Helper()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic = topic
	for p := range partitions {
		rt.Partitions = append(rt.Partitions, p)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(context.Background(), newClient(t, c))
	require.NoError(t, err)
	out := map[int32]int64{}
	for _, tp := range resp.Topics {
		for _, p := range tp.Partitions {
			out[p.Partition] = p.Offset
		}
	}
	return out
}

func TestConsumerAppliesEachRecordOnceInPartitionOrder(t *testing.T) {
	const topic, n, keys, partitions = "consume", 120, 7, 4
	c := newCluster(t, partitions, topic)
	sent := publishKeyed(t, c, topic, n, keys)
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	defer store.Close()
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	require.NoError(t, err)

	l := outboxtest.NewLedger()
	var processed atomic.Int64
	var failedOnce sync.Map
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		// Every fifth record fails its first attempt: it is retried in place.
		if offset(d)%5 == 0 {
			if _, loaded := failedOnce.LoadOrStore(d.ID, true); !loaded {
				if err := l.Apply(ctx, d); err != nil { // rolled back with the unit
					return err
				}
				return errors.New("transient")
			}
		}
		return l.Apply(ctx, d)
	}
	cs := newInboxConsumer(t, groupClient(t, c, "g1", topic), in, handle, inbox.ConsumerConfig{
		RetryBackoff: time.Millisecond,
		Processed:    func(*inbox.Delivery, inbox.Result) { processed.Add(1) },
	})
	stop := outboxtest.RunConsumer(t, cs)
	require.Eventually(t, func() bool { return processed.Load() >= n }, time.Minute, 10*time.Millisecond)
	require.NoError(t, stop())

	require.Equal(t, sent, l.RequireOnce(t, n), "each key's records were applied in publish order")

	// Every offset was committed: the group's offsets sum to the records.
	var total int64
	for _, off := range committed(t, c, "g1", topic, partitions) {
		total += off
	}
	require.EqualValues(t, n, total, "the offsets of every processed record are committed")

	// The whole topic redelivered (a new group reads from the start): every record is
	// a duplicate, the handler never runs, nothing is applied twice.
	var dups, ran atomic.Int64
	again := newInboxConsumer(t, groupClient(t, c, "g2", topic), in, func(context.Context, *inbox.Delivery) error {
		ran.Add(1)
		return nil
	}, inbox.ConsumerConfig{Processed: func(_ *inbox.Delivery, res inbox.Result) {
		if res.Duplicate {
			dups.Add(1)
		}
	}})
	stop = outboxtest.RunConsumer(t, again)
	require.Eventually(t, func() bool { return dups.Load() >= n }, time.Minute, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Zero(t, ran.Load())
	l.RequireOnce(t, n)
}

func TestNewSourceRefusesMisconfiguredClient(t *testing.T) {
	c := newCluster(t, 1, "t")
	_, err := kafkatransport.NewSource(newClient(t, c, kgo.ConsumeTopics("t")), kafkatransport.SourceConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "kgo.ConsumerGroup")
	_, err = kafkatransport.NewSource(newClient(t, c, kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t")), kafkatransport.SourceConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "kgo.DisableAutoCommit")
	_, err = kafkatransport.NewSource(nil, kafkatransport.SourceConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	ok := groupClient(t, c, "g", "t")
	_, err = kafkatransport.NewSource(ok, kafkatransport.SourceConfig{MaxPollRecords: -1})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "SourceConfig.MaxPollRecords")
	_, err = kafkatransport.NewSource(ok, kafkatransport.SourceConfig{})
	require.NoError(t, err)
}

// TestRunAgainOnTheSameSourceGetsWhatTheStopLeft stops a consumer in the middle of a
// poll and runs a new one on the same source and client: the records the first
// stopped before are received again, not committed past by the second.
func TestRunAgainOnTheSameSourceGetsWhatTheStopLeft(t *testing.T) {
	const topic, n = "consume-again", 20
	c := newCluster(t, 1, topic)
	publishKeyed(t, c, topic, n, 1)
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	defer store.Close()
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	require.NoError(t, err)
	src, err := kafkatransport.NewSource(groupClient(t, c, "g", topic, kgo.BlockRebalanceOnPoll()), kafkatransport.SourceConfig{})
	require.NoError(t, err)
	l := outboxtest.NewLedger()
	entered, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	first, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		if calls.Add(1) == 3 {
			close(entered)
			<-release
		}
		return l.Apply(ctx, d)
	}, inbox.ConsumerConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	<-entered
	cancel() // the third record is in its handler; the poll holds the rest
	close(release)
	require.NoError(t, <-done)
	require.Equal(t, 3, l.Len(), "the first consumer finished the record in progress and started no other")
	require.Equal(t, map[int32]int64{0: 3}, committed(t, c, "g", topic, 1))

	second, err := inbox.NewConsumer(src, in, l.Apply, inbox.ConsumerConfig{})
	require.NoError(t, err)
	stop := outboxtest.RunConsumer(t, second)
	require.Eventually(t, func() bool { return committed(t, c, "g", topic, 1)[0] == n }, time.Minute, 10*time.Millisecond,
		"the second consumer commits to the end")
	require.NoError(t, stop())
	applied, _ := l.Snapshot()
	require.Len(t, applied, n, "every record applied, none skipped between the two runs")
	for id, times := range applied {
		require.Equal(t, 1, times, "record %s applied once", id)
	}
}
