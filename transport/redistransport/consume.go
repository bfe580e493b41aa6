package redistransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
)

// ConsumeHandler applies the effects of one entry. It runs inside the inbox's unit of
// work: write with ctx through the store's accessors and send with ctx, and everything
// commits with the entry's inbox key. Return an error to roll back; the entry is then
// retried in place, after a pause, until it succeeds or the consumer stops.
type ConsumeHandler func(ctx context.Context, d *Delivery) error

// Defaults of [ConsumerConfig].
const (
	DefaultReadCount          = 16
	DefaultConsumeStopTimeout = 30 * time.Second
)

// ConsumerConfig configures a [Consumer].
type ConsumerConfig struct {
	// Stream is the stream's key. Required.
	Stream string
	// Group is the consumer group, which must exist (XGROUP CREATE stream group $
	// MKSTREAM). Required.
	Group string
	// Name is this consumer's name in the group: entries read but not acknowledged
	// stay pending under it, and a Consumer started again under the same name
	// processes them first. Required.
	Name string
	// ReadCount is how many entries one XREADGROUP asks for. Entries are processed
	// one at a time whatever it is; a larger count only saves round trips. Defaults
	// to DefaultReadCount (16).
	ReadCount int
	// StopTimeout bounds how long [Consumer.Run], once its ctx is done, lets the entry
	// in progress finish and be acknowledged; then its ctx is cancelled too. Defaults
	// to DefaultConsumeStopTimeout (30 s).
	StopTimeout time.Duration
	// Processed, if set, is called after an entry's unit of work committed (or it was
	// found a duplicate) and before it is acknowledged. Defaults to nil.
	Processed func(d *Delivery, res inbox.Result)
	// Logger receives failed entries, dropped entries and failed reads. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c ConsumerConfig) Validate() error {
	switch {
	case c.Stream == "":
		return fmt.Errorf("%w: redistransport: ConsumerConfig.Stream is required", outbox.ErrMisconfigured)
	case c.Group == "":
		return fmt.Errorf("%w: redistransport: ConsumerConfig.Group is required", outbox.ErrMisconfigured)
	case c.Name == "":
		return fmt.Errorf("%w: redistransport: ConsumerConfig.Name is required (a stable name per consumer process)", outbox.ErrMisconfigured)
	case c.ReadCount < 0:
		return fmt.Errorf("%w: redistransport: ConsumerConfig.ReadCount %d is negative", outbox.ErrMisconfigured, c.ReadCount)
	case c.StopTimeout < 0:
		return fmt.Errorf("%w: redistransport: ConsumerConfig.StopTimeout %v is negative", outbox.ErrMisconfigured, c.StopTimeout)
	}
	return nil
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.ReadCount == 0 {
		c.ReadCount = DefaultReadCount
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultConsumeStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Consumer is a consume loop that applies each entry's effects once through an
// [inbox.Inbox]: it reads a stream as one consumer of a consumer group, processes
// every entry in the inbox's unit of work and acknowledges it (XACK) only after that
// unit committed.
//
// # Semantics
//
//   - Entries are processed one at a time, in stream order. On start the consumer
//     first processes the entries pending under its name (read by an earlier run that
//     stopped or crashed before acknowledging them), then new ones.
//   - An entry whose handler fails is retried in place, after a pause that doubles
//     from 100 ms to 10 s, and holds back the entries behind it: order is kept.
//   - An entry is acknowledged after its unit committed. A crash or a lost XACK leaves
//     it pending; the next run under the same name processes it again and the inbox
//     finds its key: its effects are applied once (within the inbox's retention). The
//     copies Redis stores when the relay retries are skipped the same way.
//   - An entry that cannot be decoded or has no inbox key is acknowledged without
//     being processed (Redis has no dead-letter), and logged at ERROR with its id.
//   - A failed read (Redis unreachable) is logged and retried after the same doubling
//     pause. A missing group is reported by Run as an error wrapping
//     [outbox.ErrMisconfigured].
//   - [Consumer.Run] returns when its ctx is done: it lets the entry in progress
//     finish (within StopTimeout), acknowledges it and returns nil. No goroutine
//     outlives it. Entries read but not processed stay pending under the name.
//
// # Limitations
//
//   - One entry at a time: run several Consumers on several streams (for order) or
//     under several names in one group (giving up order) for parallelism.
//   - Entries pending under a name no Consumer runs under any more are not claimed
//     (XAUTOCLAIM): keep names stable per process, or claim them yourself.
//   - An entry that always fails blocks its consumer until it is fixed or removed.
type Consumer struct {
	client redis.UniversalClient
	in     *inbox.Inbox
	handle ConsumeHandler
	cfg    ConsumerConfig
}

// NewConsumer returns a consume loop reading through client (the caller's; never
// dialled or closed here). It fails with an error wrapping [outbox.ErrMisconfigured]
// when an argument is missing or cfg is invalid.
func NewConsumer(client redis.UniversalClient, in *inbox.Inbox, handle ConsumeHandler, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: redistransport: NewConsumer needs a client (redis.NewClient)", outbox.ErrMisconfigured)
	case in == nil:
		return nil, fmt.Errorf("%w: redistransport: NewConsumer needs an *inbox.Inbox (inbox.New on the store the handler writes to)", outbox.ErrMisconfigured)
	case handle == nil:
		return nil, fmt.Errorf("%w: redistransport: NewConsumer needs a ConsumeHandler", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Consumer{client: client, in: in, handle: handle, cfg: cfg.withDefaults()}, nil
}

const (
	minPause = 100 * time.Millisecond
	maxPause = 10 * time.Second
	// readBlock bounds one XREADGROUP, so a stop is noticed within it.
	readBlock = time.Second
)

// Run consumes until ctx is done, then stops gracefully (see [Consumer]) and returns
// nil. It returns an error wrapping [outbox.ErrMisconfigured] when the group does not
// exist.
func (c *Consumer) Run(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.cfg.StopTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()
	pause := minPause
	// from is "0" (this name's pending entries) until they are done, then ">".
	from := "0"
	for ctx.Err() == nil {
		args := &redis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Name,
			Streams: []string{c.cfg.Stream, from}, Count: int64(c.cfg.ReadCount),
		}
		if from == ">" {
			args.Block = readBlock
		}
		streams, err := c.client.XReadGroup(ctx, args).Result()
		if ctx.Err() != nil {
			return nil
		}
		switch {
		case errors.Is(err, redis.Nil):
			pause = minPause
			continue
		case err != nil && strings.HasPrefix(err.Error(), "NOGROUP"):
			return fmt.Errorf("%w: redistransport: consumer: stream %q has no group %q: create it (XGROUP CREATE %s %s $ MKSTREAM): %w", outbox.ErrMisconfigured, c.cfg.Stream, c.cfg.Group, c.cfg.Stream, c.cfg.Group, err)
		case err != nil:
			c.cfg.Logger.WarnContext(ctx, "redistransport: consumer: read failed; retrying", "stream", c.cfg.Stream, "error", err, "pause", pause)
			if !sleep(ctx, pause) {
				return nil
			}
			pause = min(2*pause, maxPause)
			continue
		}
		pause = minPause
		n := 0
		for _, s := range streams {
			for _, entry := range s.Messages {
				n++
				if !c.deliver(ctx, work, s.Stream, entry) {
					return nil
				}
			}
		}
		if from == "0" && n == 0 {
			from = ">" // the pending entries are done
		}
	}
	return nil
}

// deliver processes one entry, retrying in place, and acknowledges it. It reports
// false when the consumer stopped before the entry was done.
func (c *Consumer) deliver(ctx, work context.Context, stream string, entry redis.XMessage) bool {
	log := c.cfg.Logger.With("stream", stream, "entry_id", entry.ID)
	if len(entry.Values) == 0 {
		// A pending entry that was deleted (trimmed) since it was read: nothing to do.
		c.ack(ctx, work, log, stream, entry.ID)
		return true
	}
	dec, err := Decode(stream, entry)
	if err != nil {
		log.ErrorContext(ctx, "redistransport: consumer: dropping an entry that cannot be decoded (acknowledged unprocessed)", "error", err)
		c.ack(ctx, work, log, stream, entry.ID)
		return true
	}
	log = log.With("message_id", dec.ID)
	m := &dec.Message
	if _, err := c.in.Key(m); err != nil {
		log.ErrorContext(ctx, "redistransport: consumer: dropping an entry that has no inbox key (acknowledged unprocessed)", "error", err)
		c.ack(ctx, work, log, stream, entry.ID)
		return true
	}
	pause := minPause
	for {
		res, err := c.in.Process(work, m, func(ctx context.Context) error { return c.handle(ctx, &dec) })
		if err == nil {
			if c.cfg.Processed != nil {
				c.cfg.Processed(&dec, res)
			}
			c.ack(ctx, work, log, stream, entry.ID)
			return true
		}
		if work.Err() != nil {
			return false
		}
		log.WarnContext(ctx, "redistransport: consumer: entry failed; retrying it in place", "error", err, "pause", pause)
		if !sleep(ctx, pause) {
			return false // left pending under this name
		}
		pause = min(2*pause, maxPause)
	}
}

func (c *Consumer) ack(ctx, work context.Context, log *slog.Logger, stream, id string) {
	actx, cancel := context.WithTimeout(work, 5*time.Second)
	defer cancel()
	if err := c.client.XAck(actx, stream, c.cfg.Group, id).Err(); err != nil {
		log.WarnContext(ctx, "redistransport: consumer: XACK failed; the entry stays pending and is skipped as a duplicate when processed again", "error", err)
	}
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
