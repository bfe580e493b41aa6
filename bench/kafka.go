package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// As many partitions as the outbox has buckets: each bucket feeds one (see the
// Kafka transport's docs).
const partitions = 8

// broker is a fresh in-process Kafka cluster with one topic: every run gets its own,
// so no run reads another's records.
type broker struct {
	cluster *kfake.Cluster
	topic   string
}

func newBroker(topic string) (*broker, error) {
	// Small segments, so records the consumer trims (see trim) free their memory soon.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic),
		kfake.BrokerConfigs(map[string]string{"log.segment.bytes": strconv.Itoa(8 << 20)}))
	if err != nil {
		return nil, err
	}
	return &broker{cluster: c, topic: topic}, nil
}

// client is a producer with kgo's defaults: acks from all in-sync replicas and an
// idempotent producer, what the outbox's transport requires of its client.
func (b *broker) client(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(b.cluster.ListenAddrs()...)}, opts...)...)
}

func (b *broker) close() { b.cluster.Close() }

// A collector consumes the run's topic from its start and checks every record as it
// arrives against the plan: the id it carries was sent, its key and payload are
// exactly those sent, its key's ids arrive in increasing order. It keeps only a
// receipt time and a count per id, so a long soak needs no copy of its payloads.
type collector struct {
	plan      *plan
	topicName string
	client    *kgo.Client
	stop      context.CancelFunc
	done      chan struct{}

	mu        sync.Mutex
	err       error         // why the consumer stopped early
	changed   chan struct{} // closed and replaced whenever distinct grows
	firstAt   []int64       // by id: unix nanoseconds of the first receipt, 0 if none
	seen      []uint8       // by id: receipts, saturating
	distinct  int
	records   int
	corrupt   int // unknown id, or key or payload not as sent
	reordered int // first receipt of an id below its key's highest id so far
	keyMax    [keyCount]int64
	next      map[int32]int64 // per partition, the offset after the last record read
	scratch   []byte
}

// collect starts a collector. With trim, it deletes what it has read from the topic
// every second: the in-process cluster keeps every record in memory, which a long
// soak would exhaust.
func (b *broker) collect(p *plan, trim bool) (*collector, error) {
	cl, err := b.client(
		kgo.ConsumeTopics(b.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{plan: p, topicName: b.topic, client: cl, stop: cancel, done: make(chan struct{}), changed: make(chan struct{}),
		next: map[int32]int64{}, scratch: make([]byte, payloadSize)}
	for i := range c.keyMax {
		c.keyMax[i] = -1
	}
	go c.run(ctx)
	if trim {
		go c.trim(ctx)
	}
	return c, nil
}

func (c *collector) trim(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		req := kmsg.NewPtrDeleteRecordsRequest()
		req.TimeoutMillis = 5000
		topic := kmsg.NewDeleteRecordsRequestTopic()
		topic.Topic = c.topicName
		c.mu.Lock()
		for p, next := range c.next {
			part := kmsg.NewDeleteRecordsRequestTopicPartition()
			part.Partition, part.Offset = p, next
			topic.Partitions = append(topic.Partitions, part)
		}
		c.mu.Unlock()
		if len(topic.Partitions) == 0 {
			continue
		}
		req.Topics = append(req.Topics, topic)
		if _, err := req.RequestWith(ctx, c.client); err != nil && ctx.Err() == nil {
			say("  trimming the topic: %v", err)
		}
	}
}

func (c *collector) run(ctx context.Context) {
	defer close(c.done)
	for {
		fetches := c.client.PollFetches(ctx)
		at := time.Now().UnixNano()
		if ctx.Err() != nil {
			return
		}
		var errs []error
		fetches.EachError(func(topic string, partition int32, err error) {
			errs = append(errs, fmt.Errorf("%s/%d: %w", topic, partition, err))
		})
		if len(errs) > 0 {
			c.mu.Lock()
			c.err = errors.Join(errs...)
			c.mu.Unlock()
			return
		}
		c.mu.Lock()
		grew := false
		fetches.EachRecord(func(r *kgo.Record) {
			if c.take(r, at) {
				grew = true
			}
		})
		if grew {
			close(c.changed)
			c.changed = make(chan struct{})
		}
		c.mu.Unlock()
	}
}

// take checks one record; it reports whether the record was an id not seen before.
func (c *collector) take(r *kgo.Record, at int64) bool {
	c.records++
	c.next[r.Partition] = r.Offset + 1
	id, ok := payloadID(r.Value)
	if !ok || !c.plan.sent(id) {
		c.corrupt++
		return false
	}
	c.plan.fillPayload(c.scratch, id)
	if !bytes.Equal(r.Value, c.scratch) || !bytes.Equal(r.Key, c.plan.key(id)) {
		c.corrupt++
		return false
	}
	for uint64(len(c.seen)) <= id {
		c.seen = append(c.seen, make([]uint8, max(1024, len(c.seen)))...)
		c.firstAt = append(c.firstAt, make([]int64, len(c.seen)-len(c.firstAt))...)
	}
	if c.seen[id] < 255 {
		c.seen[id]++
	}
	if c.seen[id] > 1 {
		return false
	}
	c.firstAt[id] = at
	slot := c.plan.keySlot(id)
	if int64(id) < c.keyMax[slot] {
		c.reordered++
	} else {
		c.keyMax[slot] = int64(id)
	}
	c.distinct++
	return true
}

// waitFor waits until n distinct sent ids have arrived, or timeout passes.
func (c *collector) waitFor(n int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		got, changed, err := c.distinct, c.changed, c.err
		c.mu.Unlock()
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-c.done:
			return fmt.Errorf("the consumer stopped after %d of %d messages", got, n)
		case <-deadline.C:
			return fmt.Errorf("%d of %d messages arrived within %v", got, n, timeout)
		}
	}
}

// finish reads the topic to its current end, so records published late (duplicates)
// are counted too, then stops the consumer.
func (c *collector) finish(ctx context.Context) error {
	defer func() {
		c.stop()
		<-c.done
		c.client.Close()
	}()
	end, err := c.endOffsets(ctx)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.mu.Lock()
		reached, changed, cerr := true, c.changed, c.err
		for p, off := range end {
			if c.next[p] < off {
				reached = false
			}
		}
		c.mu.Unlock()
		if cerr != nil {
			return cerr
		}
		if reached {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the consumer did not reach the end of the topic within 30s")
		}
		select {
		case <-changed:
		case <-time.After(10 * time.Millisecond): // a duplicate does not grow distinct
		}
	}
}

func (c *collector) endOffsets(ctx context.Context) (map[int32]int64, error) {
	req := kmsg.NewPtrListOffsetsRequest()
	topic := kmsg.NewListOffsetsRequestTopic()
	topic.Topic = c.topicName
	for p := range int32(partitions) {
		part := kmsg.NewListOffsetsRequestTopicPartition()
		part.Partition = p
		part.Timestamp = -1 // the end
		topic.Partitions = append(topic.Partitions, part)
	}
	req.Topics = append(req.Topics, topic)
	resp, err := req.RequestWith(ctx, c.client)
	if err != nil {
		return nil, err
	}
	end := map[int32]int64{}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("end offset of partition %d: %w", p.Partition, err)
			}
			end[p.Partition] = p.Offset
		}
	}
	return end, nil
}

// check is what the consumer found, against what the writers sent.
type check struct {
	Sent, Received, Missing, Duplicates, Reordered, Corrupt int
}

func (c *collector) check() check {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := check{Sent: c.plan.total(), Received: c.records, Reordered: c.reordered, Corrupt: c.corrupt}
	for w := range c.plan.writers {
		for k := range int(c.plan.counts[w].Load()) {
			id := c.plan.id(w, k)
			switch {
			case id >= uint64(len(c.seen)) || c.seen[id] == 0:
				ch.Missing++
			case c.seen[id] > 1:
				ch.Duplicates += int(c.seen[id]) - 1
			}
		}
	}
	return ch
}

// lastFirstReceipt is when the last id to arrive first arrived: the end of a drain.
func (c *collector) lastFirstReceipt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var last int64
	for _, at := range c.firstAt {
		last = max(last, at)
	}
	return time.Unix(0, last)
}

// err reports a run whose delivery is not exact: a missing or altered message fails
// the run; duplicates and reordering are reported, not failed.
func (ch check) err() error {
	if ch.Missing > 0 || ch.Corrupt > 0 {
		return fmt.Errorf("delivery check failed: %d sent, %d missing, %d not as sent (unknown id, or key or payload altered)", ch.Sent, ch.Missing, ch.Corrupt)
	}
	return nil
}
