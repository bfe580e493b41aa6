package kafkatransport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox/driver"
)

// topicState is what the transport tracks of one topic, shared by every Publish
// call. It lives in Transport.topics, guarded by Transport.tmu.
type topicState struct {
	// inflight is the wire size (wireSize) of the records of the topic that this
	// transport handed to the client and the client has not resolved yet, from every
	// Publish call: what the client may put in one record batch of the topic.
	inflight int
	// paced is set once a broker refused a record batch of the topic as too large.
	// Its records then go to the client only while their inflight total stays within
	// the budget, so the client never builds a batch over the topic's limit.
	paced bool
	// limit is the topic's max.message.bytes as last described, 0 while unknown (a
	// paced topic with no known limit sends one record at a time). learnedAt is when
	// it was last asked for.
	limit     int
	learnedAt time.Time
	// exclusive is set while a record goes to the client alone: nothing else of the
	// topic is handed to the client until it is resolved, so that a refusal of it is
	// a refusal of that record alone.
	exclusive bool
}

// budget is how many record bytes one batch of the paced topic may carry: its limit
// less the record batch header, or 0 when the limit is unknown.
func (s *topicState) budget() int {
	if s.limit <= batchHeaderSize {
		return 0
	}
	return s.limit - batchHeaderSize
}

// limitRefresh is how long a paced topic's described limit is trusted before a
// Publish asks again, so that a limit an operator raised is picked up.
const limitRefresh = time.Minute

// topicLimitConfig is the topic config the brokers measure a record batch against.
const topicLimitConfig = "max.message.bytes"

// state returns the topic's state, creating it. t.tmu must be held.
func (t *Transport) state(topic string) *topicState {
	s := t.topics[topic]
	if s == nil {
		s = &topicState{}
		t.topics[topic] = s
	}
	return s
}

// holding is what one produce round holds of a topic: its records' wire bytes, and
// whether one of them went alone.
type holding struct {
	bytes     int
	exclusive bool
}

// release gives back what a produce round held once the client resolved its records,
// and wakes the Publish calls waiting for room.
func (t *Transport) release(held map[string]holding) {
	t.tmu.Lock()
	defer t.tmu.Unlock()
	for topic, h := range held {
		s := t.topics[topic]
		s.inflight -= h.bytes
		if h.exclusive {
			s.exclusive = false
		}
		if s.inflight == 0 && !s.paced && !s.exclusive {
			delete(t.topics, topic)
		}
	}
	close(t.wake)
	t.wake = make(chan struct{})
}

// knownToClient reports whether the client's own metadata has the topic's partitions,
// which it has once it produced to the topic.
func (t *Transport) knownToClient(topic string) bool {
	leader, _, err := t.client.PartitionLeader(topic, 0)
	return err == nil && leader >= 0
}

// missingTopics asks the cluster's metadata for topics and returns those it does not
// have. With kgo.AllowAutoTopicCreation on the client the request allows the broker
// to create them (as the client's own metadata requests do), so a topic the broker
// creates is not reported missing.
func (t *Transport) missingTopics(ctx context.Context, topics []string) (map[string]bool, error) {
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = t.autoCreate
	for _, name := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(name)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, t.client)
	if err != nil {
		return nil, fmt.Errorf("kafkatransport: metadata of %q: %w", topics, err)
	}
	missing := map[string]bool{}
	for _, rt := range resp.Topics {
		if rt.Topic != nil && rt.ErrorCode == kerr.UnknownTopicOrPartition.Code {
			missing[*rt.Topic] = true
		}
	}
	return missing, nil
}

// describeLimit asks the cluster for the topic's max.message.bytes (its own setting,
// or the broker's message.max.bytes it inherits). It needs the DESCRIBE_CONFIGS
// permission on the topic.
func (t *Transport) describeLimit(ctx context.Context, topic string) (int, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	res.ConfigNames = []string{topicLimitConfig}
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, t.client)
	if err != nil {
		return 0, fmt.Errorf("kafkatransport: describe %s of %q: %w", topicLimitConfig, topic, err)
	}
	for _, r := range resp.Resources {
		if r.ResourceName != topic {
			continue
		}
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			return 0, fmt.Errorf("kafkatransport: describe %s of %q: %w", topicLimitConfig, topic, err)
		}
		for _, c := range r.Configs {
			if c.Name == topicLimitConfig && c.Value != nil {
				n, err := strconv.Atoi(*c.Value)
				if err != nil || n <= 0 {
					return 0, fmt.Errorf("kafkatransport: topic %q has %s %q, not a positive number", topic, topicLimitConfig, *c.Value)
				}
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("kafkatransport: describe %s of %q: %w", topicLimitConfig, topic, errNoLimit)
}

var errNoLimit = errors.New("the answer does not carry it")

// learnLimit asks for the topic's limit and paces the topic by it: a topic whose limit
// is at least the client's batch limit needs no pacing, since the client never builds
// a larger batch. A limit that cannot be described is left as it was (unknown at
// first: one record at a time), and asked for again after limitRefresh.
func (t *Transport) learnLimit(ctx context.Context, topic string) {
	limit, err := t.describeLimit(ctx, topic)
	t.tmu.Lock()
	defer t.tmu.Unlock()
	s := t.state(topic)
	s.learnedAt = time.Now()
	if err != nil {
		return
	}
	s.limit = limit
	s.paced = limit < t.batchMax
}

// unknownTopic is the error for a record of a topic the cluster does not have.
func (t *Transport) unknownTopic(topic string, cause error) error {
	err := fmt.Errorf("kafkatransport: topic %q does not exist: %w", topic, cause)
	if t.cfg.UnknownTopicPermanent {
		return driver.Permanent(err)
	}
	return err
}
