package natstransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
)

// ConsumeHandler applies the effects of one message. It runs inside the inbox's unit
// of work: write with ctx through the store's accessors and send with ctx, and
// everything commits with the message's inbox key. Return an error to roll back; the
// message is then retried in place, after a pause, until it succeeds or the consumer
// stops.
type ConsumeHandler func(ctx context.Context, d *Delivery) error

// Defaults of [ConsumerConfig].
const (
	DefaultFetchBatch         = 16
	DefaultConsumeStopTimeout = 30 * time.Second
)

// ConsumerConfig configures a [Consumer].
type ConsumerConfig struct {
	// FetchBatch is how many messages one pull asks for. Messages are processed one at
	// a time whatever it is; a larger batch only saves round trips. Keep it well under
	// the JetStream consumer's MaxAckPending. Defaults to DefaultFetchBatch (16).
	FetchBatch int
	// StopTimeout bounds how long [Consumer.Run], once its ctx is done, lets the
	// message in progress finish and be acknowledged; then its ctx is cancelled too.
	// Defaults to DefaultConsumeStopTimeout (30 s).
	StopTimeout time.Duration
	// Processed, if set, is called after a message's unit of work committed (or it was
	// found a duplicate) and before it is acknowledged. Defaults to nil.
	Processed func(d *Delivery, res inbox.Result)
	// Logger receives failed messages, terminated messages and failed pulls. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c ConsumerConfig) Validate() error {
	switch {
	case c.FetchBatch < 0:
		return fmt.Errorf("%w: natstransport: ConsumerConfig.FetchBatch %d is negative", outbox.ErrMisconfigured, c.FetchBatch)
	case c.StopTimeout < 0:
		return fmt.Errorf("%w: natstransport: ConsumerConfig.StopTimeout %v is negative", outbox.ErrMisconfigured, c.StopTimeout)
	}
	return nil
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.FetchBatch == 0 {
		c.FetchBatch = DefaultFetchBatch
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultConsumeStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Consumer is a consume loop that applies each message's effects once through an
// [inbox.Inbox]: it pulls from a JetStream pull consumer the caller created (a
// durable one, with AckPolicy explicit), processes every message in the inbox's unit
// of work and acknowledges it only after that unit committed.
//
// # Semantics
//
//   - Messages are processed one at a time, in the order the JetStream consumer
//     delivers them: the stream's order, so a key's messages are applied in the order
//     they were stored.
//   - A message whose handler fails is retried in place, after a pause that doubles
//     from 100 ms to 10 s, and holds back the messages behind it: order is kept.
//     Before each retry the consumer tells the server the message is in progress, so
//     its AckWait does not run out meanwhile.
//   - A message is acknowledged (and the server's confirmation awaited) after its unit
//     committed. A crash or a lost acknowledgement leaves it unacknowledged; the
//     server delivers it again after AckWait, and the inbox finds its key: its effects
//     are applied once (within the inbox's retention).
//   - A message that cannot be decoded or has no inbox key is terminated (Term: never
//     redelivered) and logged at ERROR.
//   - A failed pull (the connection is down, the consumer is missing) is logged and
//     retried after the same doubling pause; the connection reconnects by itself.
//   - [Consumer.Run] returns when its ctx is done: it lets the message in progress
//     finish (within StopTimeout), acknowledges it and returns nil. No goroutine
//     outlives it. Messages pulled but not processed are left unacknowledged: the
//     server delivers them again after AckWait.
//
// # Limitations
//
//   - One message at a time: run several Consumers on several JetStream consumers
//     (filtered on different subjects, for order) for parallelism. Two Consumers on
//     one JetStream consumer share its messages and give up order.
//   - A message that always fails blocks its consumer until it is fixed or removed;
//     the Consumer does not give up after a number of attempts (the JetStream
//     consumer's MaxDeliver does not apply, as the message is not redelivered).
type Consumer struct {
	cons   jetstream.Consumer
	in     *inbox.Inbox
	handle ConsumeHandler
	cfg    ConsumerConfig
}

// NewConsumer returns a consume loop over cons, a pull consumer the caller created
// (stream.CreateOrUpdateConsumer with a Durable name and
// jetstream.AckExplicitPolicy). It fails with an error wrapping
// [outbox.ErrMisconfigured] when an argument is missing or cfg is invalid.
func NewConsumer(cons jetstream.Consumer, in *inbox.Inbox, handle ConsumeHandler, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case cons == nil:
		return nil, fmt.Errorf("%w: natstransport: NewConsumer needs a jetstream.Consumer (stream.CreateOrUpdateConsumer)", outbox.ErrMisconfigured)
	case in == nil:
		return nil, fmt.Errorf("%w: natstransport: NewConsumer needs an *inbox.Inbox (inbox.New on the store the handler writes to)", outbox.ErrMisconfigured)
	case handle == nil:
		return nil, fmt.Errorf("%w: natstransport: NewConsumer needs a ConsumeHandler", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if info := cons.CachedInfo(); info != nil && info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: natstransport: the JetStream consumer %q has ack policy %s: create it with AckPolicy jetstream.AckExplicitPolicy, so a message is acknowledged only after its unit of work committed", outbox.ErrMisconfigured, info.Name, info.Config.AckPolicy)
	}
	return &Consumer{cons: cons, in: in, handle: handle, cfg: cfg.withDefaults()}, nil
}

const (
	minPause = 100 * time.Millisecond
	maxPause = 10 * time.Second
	// fetchWait bounds one pull, so a stop is noticed within it.
	fetchWait = time.Second
)

// Run consumes until ctx is done, then stops gracefully (see [Consumer]) and returns
// nil.
func (c *Consumer) Run(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(c.cfg.StopTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()
	pause := minPause
	for ctx.Err() == nil {
		batch, err := c.cons.Fetch(c.cfg.FetchBatch, jetstream.FetchMaxWait(fetchWait))
		if err == nil {
			for msg := range batch.Messages() {
				if ctx.Err() != nil {
					continue // drain the batch unprocessed: redelivered after AckWait
				}
				c.deliver(ctx, work, msg)
			}
			err = batch.Error()
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
			pause = minPause
			continue
		}
		c.cfg.Logger.WarnContext(ctx, "natstransport: consumer: pull failed; retrying", "error", err, "pause", pause)
		if !sleep(ctx, pause) {
			return nil
		}
		pause = min(2*pause, maxPause)
	}
	return nil
}

// deliver processes one message, retrying in place, and settles it. It returns early,
// leaving the message unacknowledged, when the consumer stops.
func (c *Consumer) deliver(ctx, work context.Context, msg jetstream.Msg) {
	log := c.cfg.Logger.With("subject", msg.Subject())
	dec, err := Decode(msg)
	if err != nil {
		log.ErrorContext(ctx, "natstransport: consumer: terminating a message that cannot be decoded (never redelivered)", "error", err)
		_ = msg.Term()
		return
	}
	log = log.With("message_id", dec.ID, "stream_sequence", dec.Sequence)
	m := &dec.Message
	if _, err := c.in.Key(m); err != nil {
		log.ErrorContext(ctx, "natstransport: consumer: terminating a message that has no inbox key (never redelivered)", "error", err)
		_ = msg.Term()
		return
	}
	pause := minPause
	for {
		res, err := c.in.Process(work, m, func(ctx context.Context) error { return c.handle(ctx, &dec) })
		if err == nil {
			if c.cfg.Processed != nil {
				c.cfg.Processed(&dec, res)
			}
			actx, cancel := context.WithTimeout(work, 5*time.Second)
			if err := msg.DoubleAck(actx); err != nil {
				log.WarnContext(ctx, "natstransport: consumer: acknowledgement failed; the message comes again and is skipped as a duplicate", "error", err)
			}
			cancel()
			return
		}
		if work.Err() != nil {
			return
		}
		log.WarnContext(ctx, "natstransport: consumer: message failed; retrying it in place", "error", err, "pause", pause)
		_ = msg.InProgress() // restarts the server's AckWait
		if !sleep(ctx, pause) {
			return // left unacknowledged: the server delivers it again
		}
		pause = min(2*pause, maxPause)
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
