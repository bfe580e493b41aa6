package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// kafkaBroker publishes through transport/kafkatransport and reads the topic back with a
// consumer that starts where the topic ended when the broker was opened, so records
// that earlier runs left on a real cluster are not counted.
type kafkaBroker struct {
	*kafkatransport.Transport
	name     string
	cluster  *kfake.Cluster // the in-process cluster; nil with real brokers
	producer *kgo.Client
	consumer *kgo.Client
	next     map[int32]int64 // per partition, the offset of the next record to read
	received []delivery
}

// openKafka connects to seeds, or starts an in-process cluster when there are none.
func openKafka(ctx context.Context, seeds []string) (_ *kafkaBroker, err error) {
	b := &kafkaBroker{name: "Kafka at " + strings.Join(seeds, ",")}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if len(seeds) == 0 {
		// Three partitions, as a real topic has several: keys spread over them.
		b.cluster, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, topic))
		if err != nil {
			return nil, err
		}
		b.name, seeds = "a Kafka cluster in this process", b.cluster.ListenAddrs()
	}
	// kgo's defaults are what the transport needs: acks from all in-sync replicas and
	// an idempotent producer.
	if b.producer, err = kgo.NewClient(kgo.SeedBrokers(seeds...)); err != nil {
		return nil, err
	}
	if b.Transport, err = kafkatransport.New(b.producer, kafkatransport.Config{}); err != nil {
		return nil, err
	}
	if b.next, err = b.endOffsets(ctx); err != nil {
		return nil, err
	}
	start := map[int32]kgo.Offset{}
	for partition, offset := range b.next {
		start[partition] = kgo.NewOffset().At(offset)
	}
	b.consumer, err = kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: start}),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (b *kafkaBroker) Name() string { return b.name }

// Received reads the topic up to its current end and returns every message read since
// the broker was opened.
func (b *kafkaBroker) Received(ctx context.Context) ([]delivery, error) {
	end, err := b.endOffsets(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for !b.reached(end) {
		fetches := b.consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s back from Kafka: %w", topic, err)
		}
		if err := fetches.Err(); err != nil {
			return nil, err
		}
		for _, rec := range fetches.Records() {
			d, err := kafkatransport.Decode(rec)
			if err != nil {
				return nil, err
			}
			idempotencyKey, _ := d.Header(outbox.HeaderIdempotencyKey)
			b.received = append(b.received, delivery{
				Topic: d.Topic, Key: d.Key, Payload: d.Payload,
				ID: d.ID.String(), IdempotencyKey: string(idempotencyKey),
			})
			b.next[rec.Partition] = rec.Offset + 1
		}
	}
	return slices.Clone(b.received), nil
}

// reached reports whether the consumer has read every partition up to end.
func (b *kafkaBroker) reached(end map[int32]int64) bool {
	for partition, offset := range end {
		if b.next[partition] < offset {
			return false
		}
	}
	return true
}

// endOffsets asks the cluster where each partition of the topic ends now.
func (b *kafkaBroker) endOffsets(ctx context.Context) (map[int32]int64, error) {
	meta := kmsg.NewPtrMetadataRequest()
	metaTopic := kmsg.NewMetadataRequestTopic()
	metaTopic.Topic = kmsg.StringPtr(topic)
	meta.Topics = append(meta.Topics, metaTopic)
	metaResp, err := meta.RequestWith(ctx, b.producer)
	if err != nil {
		return nil, fmt.Errorf("kafka: metadata for %s: %w", topic, err)
	}
	if len(metaResp.Topics) != 1 {
		return nil, fmt.Errorf("kafka: metadata for %s: got %d topics", topic, len(metaResp.Topics))
	}
	if err := kerr.ErrorForCode(metaResp.Topics[0].ErrorCode); err != nil {
		return nil, fmt.Errorf("kafka: topic %s: %w (the example does not create topics: create it first)", topic, err)
	}

	list := kmsg.NewPtrListOffsetsRequest()
	listTopic := kmsg.NewListOffsetsRequestTopic()
	listTopic.Topic = topic
	for _, p := range metaResp.Topics[0].Partitions {
		listPartition := kmsg.NewListOffsetsRequestTopicPartition()
		listPartition.Partition = p.Partition
		listPartition.Timestamp = -1 // the end of the partition
		listTopic.Partitions = append(listTopic.Partitions, listPartition)
	}
	list.Topics = append(list.Topics, listTopic)
	listResp, err := list.RequestWith(ctx, b.producer)
	if err != nil {
		return nil, fmt.Errorf("kafka: end offsets of %s: %w", topic, err)
	}
	end := map[int32]int64{}
	for _, t := range listResp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("kafka: end offset of %s/%d: %w", topic, p.Partition, err)
			}
			end[p.Partition] = p.Offset
		}
	}
	if len(end) == 0 {
		return nil, errors.New("kafka: topic " + topic + " has no partitions")
	}
	return end, nil
}

func (b *kafkaBroker) Close() error {
	b.close()
	return nil
}

func (b *kafkaBroker) close() {
	for _, cl := range []*kgo.Client{b.consumer, b.producer} {
		if cl != nil {
			cl.Close()
		}
	}
	if b.cluster != nil {
		b.cluster.Close()
	}
}
