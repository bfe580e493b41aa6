package kafkatransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// DefaultMaxPollRecords is the default of [SourceConfig.MaxPollRecords].
const DefaultMaxPollRecords = 500

// SourceConfig configures a [Source].
type SourceConfig struct {
	// MaxPollRecords bounds the records one poll hands to the consumer. Defaults to
	// DefaultMaxPollRecords (500).
	MaxPollRecords int
	// Logger receives failed fetches. Defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c SourceConfig) Validate() error {
	return transportkit.Positive("kafkatransport", "SourceConfig.MaxPollRecords", c.MaxPollRecords, "the default")
}

// Source is Kafka's side of an [inbox.Consumer]. Each partition of a poll is a
// lane: its records are processed one at a time, in offset order, the partitions of
// one poll concurrently, and the next poll starts when every record of the last one
// is done and its offsets are committed. What is Kafka's own:
//
//   - The offsets of a poll are committed in one commit, per partition up to the
//     last record done: never past a record that failed (it is retried in place,
//     holding its partition and so the next poll) or that the consumer stopped
//     before; a later Run on the same source receives those again. A crash, a failed commit or a rebalance redelivers records whose units
//     committed, and the inbox finds them duplicates.
//   - A record whose inbox key cannot be derived (no idempotency-key or message id
//     header and no inbox.Config.KeyFunc) is skipped, its offset committed with the
//     others. A record without the outbox's message id is still processed when the
//     inbox can key it (its Delivery's ID is zero).
//   - With kgo.BlockRebalanceOnPoll, the source allows a rebalance after each poll's
//     offsets are committed. Without it, a rebalance during a poll's processing may
//     hand a partition to another consumer while this one still processes it; the
//     inbox keeps the effects once, and the duplicate work is wasted.
//   - A [inbox.Delivery]'s Raw is the *kgo.Record (offset, timestamp, leader epoch).
//     Redelivered is always false: Kafka does not say.
type Source struct {
	client *kgo.Client
	cfg    SourceConfig
	block  bool

	mu      sync.Mutex
	skipped []*kgo.Record // rejected in this poll: committed with the others

	polled map[partition][]*kgo.Record // the last poll's records, for Ack's rewind
}

type partition struct {
	topic string
	id    int32
}

// NewSource returns a source on client, which the caller builds with
// kgo.ConsumerGroup, kgo.ConsumeTopics and kgo.DisableAutoCommit (auto-commit would
// commit offsets of records whose units have not committed); NewSource refuses a
// client without a group or with auto-commit, with an error wrapping
// [outbox.ErrMisconfigured]. The source never closes the client.
func NewSource(client *kgo.Client, cfg SourceConfig) (*Source, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: kafkatransport: NewSource needs a *kgo.Client", outbox.ErrMisconfigured)
	}
	if group, _ := client.OptValue(kgo.ConsumerGroup).(string); group == "" {
		return nil, fmt.Errorf("%w: kafkatransport: NewSource needs a client of a consumer group: build it with kgo.ConsumerGroup(name) and kgo.ConsumeTopics(...)", outbox.ErrMisconfigured)
	}
	if off, _ := client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return nil, fmt.Errorf("%w: kafkatransport: NewSource needs a client built with kgo.DisableAutoCommit(): the consumer commits each offset after the record's unit of work committed, and auto-commit would commit earlier", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	block, _ := client.OptValue(kgo.BlockRebalanceOnPoll).(bool)
	cfg.MaxPollRecords = cmp.Or(cfg.MaxPollRecords, DefaultMaxPollRecords)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	return &Source{client: client, cfg: cfg, block: block}, nil
}

// Receive polls once and returns each partition's records as a lane. It returns an
// error wrapping [outbox.ErrClosed] if the client was closed; failed fetches are
// logged, and the records fetched with them returned.
func (s *Source) Receive(ctx context.Context) ([][]*inbox.Delivery, error) {
	fetches := s.client.PollRecords(ctx, s.cfg.MaxPollRecords)
	if fetches.IsClientClosed() {
		return nil, fmt.Errorf("kafkatransport: source: %w: the client was closed while the consumer ran", outbox.ErrClosed)
	}
	fetches.EachError(func(topic string, partition int32, err error) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			s.cfg.Logger.WarnContext(ctx, "kafkatransport: source: fetch failed", "topic", topic, "partition", partition, "error", err)
		}
	})
	var lanes [][]*inbox.Delivery
	s.polled = map[partition][]*kgo.Record{}
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		s.polled[partition{p.Topic, p.Partition}] = p.Records
		lane := make([]*inbox.Delivery, len(p.Records))
		for i, rec := range p.Records {
			// A record without the outbox's message id still goes to the inbox, which
			// keys it by its idempotency-key header or its KeyFunc, or rejects it.
			d, _ := Decode(rec)
			lane[i] = &inbox.Delivery{ID: d.ID, Message: d.Message, Raw: rec}
		}
		lanes = append(lanes, lane)
	})
	return lanes, nil
}

// Ack commits, per partition, the offset after the last record done (processed or
// skipped), in one commit; moves the client's fetch position back to the first
// record the consumer stopped before, so that a later Run on this source receives it
// instead of committing past it; and then allows a rebalance if the client blocks
// them on poll.
func (s *Source) Ack(ctx context.Context, ds []*inbox.Delivery) error {
	s.mu.Lock()
	recs := s.skipped
	s.skipped = nil
	s.mu.Unlock()
	for _, d := range ds {
		recs = append(recs, d.Raw.(*kgo.Record))
	}
	last := map[partition]*kgo.Record{}
	for _, rec := range recs {
		p := partition{rec.Topic, rec.Partition}
		if prev := last[p]; prev == nil || rec.Offset > prev.Offset {
			last[p] = rec
		}
	}
	var err error
	if len(last) > 0 {
		commit := make([]*kgo.Record, 0, len(last))
		for _, rec := range last {
			commit = append(commit, rec)
		}
		err = s.client.CommitRecords(ctx, commit...)
	}
	s.rewind(last)
	if s.block {
		s.client.AllowRebalance()
	}
	return err
}

// rewind sets the fetch position of each partition of the last poll whose records
// were not all done to its first record not done: the client has fetched past it, and
// the next poll would otherwise start after it. It runs on the polling goroutine
// before a rebalance is allowed, as kgo asks of SetOffsets in a group.
func (s *Source) rewind(last map[partition]*kgo.Record) {
	back := map[string]map[int32]kgo.EpochOffset{}
	for p, recs := range s.polled {
		done := last[p]
		i := 0
		if done != nil {
			i = sort.Search(len(recs), func(i int) bool { return recs[i].Offset > done.Offset })
		}
		if i == len(recs) {
			continue
		}
		if back[p.topic] == nil {
			back[p.topic] = map[int32]kgo.EpochOffset{}
		}
		back[p.topic][p.id] = kgo.EpochOffset{Epoch: recs[i].LeaderEpoch, Offset: recs[i].Offset}
	}
	s.polled = nil
	if len(back) > 0 {
		s.client.SetOffsets(back)
	}
}

// Reject skips a record that can never be processed: its offset is committed with
// the poll's others.
func (s *Source) Reject(_ context.Context, d *inbox.Delivery, _ error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.skipped = append(s.skipped, d.Raw.(*kgo.Record))
	return nil
}
