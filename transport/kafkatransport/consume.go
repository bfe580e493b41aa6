package kafkatransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
)

// Handler applies the effects of one delivered record. It runs inside the inbox's
// unit of work: write with ctx through the store's accessors and send with ctx, and
// everything commits with the record's inbox key. Return an error to roll back; the
// record is then retried.
type Handler func(ctx context.Context, d Delivery) error

// Defaults of [ConsumerConfig].
const (
	DefaultMaxPollRecords  = 500
	DefaultRetryBackoff    = 100 * time.Millisecond
	DefaultMaxRetryBackoff = 10 * time.Second
	DefaultStopTimeout     = 30 * time.Second
)

// ConsumerConfig configures a [Consumer].
type ConsumerConfig struct {
	// MaxPollRecords bounds the records one poll hands to the consumer. Defaults to
	// DefaultMaxPollRecords (500).
	MaxPollRecords int
	// RetryBackoff is the wait after a record's first failure, doubled after each
	// further failure up to MaxRetryBackoff. Defaults to 100 ms and 10 s.
	RetryBackoff, MaxRetryBackoff time.Duration
	// StopTimeout bounds how long [Consumer.Run], once its ctx is done, lets the
	// records in progress finish and the last offsets commit; then their ctx is
	// cancelled too. Defaults to DefaultStopTimeout (30 s).
	StopTimeout time.Duration
	// Processed, if set, is called after a record's unit of work committed (or the
	// record was found a duplicate) and before its offset is committed. Defaults to
	// nil.
	Processed func(d Delivery, res inbox.Result)
	// Logger receives failed records, skipped records and failed offset commits.
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c ConsumerConfig) Validate() error {
	switch {
	case c.MaxPollRecords < 0:
		return fmt.Errorf("%w: kafkatransport: ConsumerConfig.MaxPollRecords %d is negative", outbox.ErrMisconfigured, c.MaxPollRecords)
	case c.RetryBackoff < 0 || c.MaxRetryBackoff < 0:
		return fmt.Errorf("%w: kafkatransport: ConsumerConfig.RetryBackoff and MaxRetryBackoff must not be negative", outbox.ErrMisconfigured)
	case c.StopTimeout < 0:
		return fmt.Errorf("%w: kafkatransport: ConsumerConfig.StopTimeout %v is negative", outbox.ErrMisconfigured, c.StopTimeout)
	}
	return nil
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = DefaultMaxPollRecords
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.MaxRetryBackoff == 0 {
		c.MaxRetryBackoff = DefaultMaxRetryBackoff
	}
	if c.MaxRetryBackoff < c.RetryBackoff {
		c.MaxRetryBackoff = c.RetryBackoff
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Consumer is a consume loop that applies each record's effects once through an
// [inbox.Inbox]: every record is processed in the inbox's unit of work, and its
// offset is committed only after that unit committed.
//
// # Semantics
//
//   - Records of one partition are processed one at a time, in offset order;
//     partitions of one poll are processed concurrently. The next poll starts when
//     every record of the last one is done and its offsets are committed.
//   - A record whose handler (or unit of work) fails is retried in place with
//     backoff, holding its partition, until it succeeds or the consumer stops.
//   - A crash, a failed offset commit or a rebalance redelivers records whose units
//     committed: the inbox finds their keys and skips them, so their effects are
//     applied once (within the inbox's retention).
//   - A record whose inbox key cannot be derived (no idempotency-key or message id
//     header and no inbox.Config.KeyFunc) can never be processed once: it is logged
//     at ERROR and skipped, its offset committed with the others.
//   - [Consumer.Run] returns when its ctx is done: it polls no more, lets the records
//     in progress finish (within StopTimeout), commits their offsets and returns nil.
//     No goroutine outlives it.
//
// # Limitations
//
//   - A record that keeps failing holds its partition and, since polls wait for
//     every partition, the consumer: fix the cause, or make the handler skip what it
//     can never apply.
//   - Without kgo.BlockRebalanceOnPoll, a rebalance during a poll's processing may
//     hand a partition to another consumer while this one still processes it; the
//     inbox keeps the effects once, and the duplicate work is wasted. With it, the
//     consumer allows the rebalance after each poll's offsets are committed.
type Consumer struct {
	client *kgo.Client
	in     *inbox.Inbox
	handle Handler
	cfg    ConsumerConfig
	block  bool
}

// NewConsumer returns a consume loop on client, which the caller builds with
// kgo.ConsumerGroup, kgo.ConsumeTopics and kgo.DisableAutoCommit (auto-commit
// would commit offsets of records whose units have not committed); NewConsumer
// refuses a client without a group or with auto-commit, with an error wrapping
// [outbox.ErrMisconfigured]. The consumer never closes the client.
func NewConsumer(client *kgo.Client, in *inbox.Inbox, handle Handler, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: kafkatransport: NewConsumer needs a *kgo.Client", outbox.ErrMisconfigured)
	case in == nil:
		return nil, fmt.Errorf("%w: kafkatransport: NewConsumer needs an *inbox.Inbox (inbox.New on the store the handler writes to)", outbox.ErrMisconfigured)
	case handle == nil:
		return nil, fmt.Errorf("%w: kafkatransport: NewConsumer needs a Handler", outbox.ErrMisconfigured)
	}
	if group, _ := client.OptValue(kgo.ConsumerGroup).(string); group == "" {
		return nil, fmt.Errorf("%w: kafkatransport: NewConsumer needs a client of a consumer group: build it with kgo.ConsumerGroup(name) and kgo.ConsumeTopics(...)", outbox.ErrMisconfigured)
	}
	if off, _ := client.OptValue(kgo.DisableAutoCommit).(bool); !off {
		return nil, fmt.Errorf("%w: kafkatransport: NewConsumer needs a client built with kgo.DisableAutoCommit(): the consumer commits each offset after the record's unit of work committed, and auto-commit would commit earlier", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	block, _ := client.OptValue(kgo.BlockRebalanceOnPoll).(bool)
	return &Consumer{client: client, in: in, handle: handle, cfg: cfg.withDefaults(), block: block}, nil
}

// Run consumes until ctx is done, then stops gracefully (see [Consumer]) and returns
// nil. It returns an error wrapping [outbox.ErrClosed] if the client is closed under
// it. Run one Run per Consumer at a time.
func (c *Consumer) Run(ctx context.Context) error {
	// Work in progress outlives ctx by StopTimeout at most.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.cfg.StopTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()
	for {
		if ctx.Err() != nil {
			return nil
		}
		fetches := c.client.PollRecords(ctx, c.cfg.MaxPollRecords)
		if fetches.IsClientClosed() {
			return fmt.Errorf("kafkatransport: consumer: %w: the client was closed while the consumer ran", outbox.ErrClosed)
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				c.cfg.Logger.WarnContext(ctx, "kafkatransport: consumer: fetch failed", "topic", topic, "partition", partition, "error", err)
			}
		})
		c.process(ctx, work, fetches)
		if c.block {
			c.client.AllowRebalance()
		}
	}
}

// process handles one poll: each partition in its own goroutine, then one offset
// commit of everything done.
func (c *Consumer) process(ctx, work context.Context, fetches kgo.Fetches) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done []*kgo.Record
	)
	fetches.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last *kgo.Record
			for _, rec := range p.Records {
				if ctx.Err() != nil || !c.processRecord(ctx, work, rec) {
					break
				}
				last = rec
			}
			if last != nil {
				mu.Lock()
				done = append(done, last)
				mu.Unlock()
			}
		}()
	})
	wg.Wait()
	if len(done) == 0 {
		return
	}
	if err := c.client.CommitRecords(work, done...); err != nil {
		// The records are redelivered (after a rebalance or a restart) and found
		// duplicates by the inbox.
		c.cfg.Logger.WarnContext(ctx, "kafkatransport: consumer: offset commit failed; the records will be redelivered and skipped as duplicates", "records", len(done), "error", err)
	}
}

// processRecord runs one record through the inbox, retrying until it commits. It
// reports false if the consumer stopped before the record was done.
func (c *Consumer) processRecord(ctx, work context.Context, rec *kgo.Record) bool {
	d, decodeErr := Decode(rec)
	if _, err := c.in.Key(&d.Message); err != nil {
		c.cfg.Logger.ErrorContext(ctx, "kafkatransport: consumer: skipping a record that has no inbox key", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "error", err, "decode", decodeErr)
		return true
	}
	wait := c.cfg.RetryBackoff
	for attempt := 1; ; attempt++ {
		res, err := c.in.Process(work, &d.Message, func(ctx context.Context) error { return c.handle(ctx, d) })
		if err == nil {
			if c.cfg.Processed != nil {
				c.cfg.Processed(d, res)
			}
			return true
		}
		if work.Err() != nil {
			return false
		}
		c.cfg.Logger.WarnContext(ctx, "kafkatransport: consumer: record failed; retrying", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", attempt, "error", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		wait = min(2*wait, c.cfg.MaxRetryBackoff)
	}
}
