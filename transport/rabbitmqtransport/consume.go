package rabbitmqtransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
)

// ConsumeHandler applies the effects of one delivery. It runs inside the inbox's unit
// of work: write with ctx through the store's accessors and send with ctx, and
// everything commits with the message's inbox key. Return an error to roll back; the
// delivery is then retried in place, after a pause, until it succeeds or the consumer
// stops.
type ConsumeHandler func(ctx context.Context, d *Delivery) error

// Defaults of [ConsumerConfig].
const (
	DefaultPrefetch           = 16
	DefaultConsumeStopTimeout = 30 * time.Second
)

// ConsumerConfig configures a [Consumer].
type ConsumerConfig struct {
	// Queue is the queue to consume. Required.
	Queue string
	// Prefetch is how many unacknowledged deliveries the broker sends ahead (basic.qos
	// on the consumer's channel). Deliveries are processed one at a time whatever it
	// is; a larger prefetch only saves round trips. Defaults to DefaultPrefetch (16).
	Prefetch int
	// StopTimeout bounds how long [Consumer.Run], once its ctx is done, lets the
	// delivery in progress finish and be acknowledged; then its ctx is cancelled too.
	// Defaults to DefaultConsumeStopTimeout (30 s).
	StopTimeout time.Duration
	// Processed, if set, is called after a delivery's unit of work committed (or it
	// was found a duplicate) and before it is acknowledged. Defaults to nil.
	Processed func(d *Delivery, res inbox.Result)
	// Logger receives failed deliveries, rejections and reconnections. Defaults to
	// slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c ConsumerConfig) Validate() error {
	switch {
	case c.Queue == "":
		return fmt.Errorf("%w: rabbitmqtransport: ConsumerConfig.Queue is required", outbox.ErrMisconfigured)
	case c.Prefetch < 0 || c.Prefetch > 65535:
		return fmt.Errorf("%w: rabbitmqtransport: ConsumerConfig.Prefetch %d: AMQP takes 0 (the default) to 65535", outbox.ErrMisconfigured, c.Prefetch)
	case c.StopTimeout < 0:
		return fmt.Errorf("%w: rabbitmqtransport: ConsumerConfig.StopTimeout %v is negative", outbox.ErrMisconfigured, c.StopTimeout)
	}
	return nil
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.Prefetch == 0 {
		c.Prefetch = DefaultPrefetch
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultConsumeStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Consumer is a consume loop that applies each delivery's effects once through an
// [inbox.Inbox]: every delivery is processed in the inbox's unit of work and
// acknowledged only after that unit committed.
//
// # Semantics
//
//   - Deliveries are processed one at a time, in the order the broker delivers them:
//     with one consumer on the queue, the queue's order, so a key's messages are
//     applied in the order they were published.
//   - A delivery whose handler fails is retried in place, after a pause that doubles
//     from 100 ms to 10 s, and holds back the deliveries behind it: order is kept.
//   - A delivery is acknowledged after its unit committed. A crash, a broken
//     connection or a lost acknowledgement leaves it unacknowledged; the broker
//     delivers it again, and the inbox finds its key: its effects are applied once
//     (within the inbox's retention).
//   - A delivery that cannot be decoded or has no inbox key is rejected without
//     requeueing and logged at ERROR: give the queue a dead-letter exchange to keep
//     such messages.
//   - When the connection breaks, the consumer dials again (after the same doubling
//     pause) and consumes on.
//   - [Consumer.Run] returns when its ctx is done: it lets the delivery in progress
//     finish (within StopTimeout), acknowledges it, closes its connection and returns
//     nil. No goroutine outlives it.
//
// # Limitations
//
//   - One delivery at a time: run several Consumers (on several queues, for order,
//     or on one queue, giving up order) for parallelism.
//   - A message that always fails blocks its queue until it is fixed or removed; the
//     consumer does not dead-letter after a number of attempts.
type Consumer struct {
	dial   Dialer
	in     *inbox.Inbox
	handle ConsumeHandler
	cfg    ConsumerConfig
}

// NewConsumer returns a consume loop over connections dial opens (see [Dialer];
// NewConsumer itself does not dial). It fails with an error wrapping
// [outbox.ErrMisconfigured] when an argument is missing or cfg is invalid.
func NewConsumer(dial Dialer, in *inbox.Inbox, handle ConsumeHandler, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case dial == nil:
		return nil, fmt.Errorf("%w: rabbitmqtransport: NewConsumer needs a Dialer", outbox.ErrMisconfigured)
	case in == nil:
		return nil, fmt.Errorf("%w: rabbitmqtransport: NewConsumer needs an *inbox.Inbox (inbox.New on the store the handler writes to)", outbox.ErrMisconfigured)
	case handle == nil:
		return nil, fmt.Errorf("%w: rabbitmqtransport: NewConsumer needs a ConsumeHandler", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Consumer{dial: dial, in: in, handle: handle, cfg: cfg.withDefaults()}, nil
}

const (
	minPause = 100 * time.Millisecond
	maxPause = 10 * time.Second
)

// Run consumes until ctx is done, then stops gracefully (see [Consumer]) and returns
// nil. It returns an error only for a misconfiguration found on dialing (a connection
// with the client's own recovery).
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
		consumed, err := c.session(ctx, work)
		if errors.Is(err, outbox.ErrMisconfigured) {
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		if consumed {
			pause = minPause
		}
		c.cfg.Logger.WarnContext(ctx, "rabbitmqtransport: consumer: connection lost; dialing again", "queue", c.cfg.Queue, "error", err, "pause", pause)
		if !sleep(ctx, pause) {
			return nil
		}
		pause = min(2*pause, maxPause)
	}
	return nil
}

// session consumes on one connection until it breaks or ctx is done. It reports
// whether it processed anything.
func (c *Consumer) session(ctx, work context.Context) (consumed bool, err error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return false, fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	if conn.IsRecoveryEnabled() {
		return false, fmt.Errorf("%w: rabbitmqtransport: dial returned a connection with amqp.Config.Recovery set: leave Recovery nil, the consumer reconnects by itself", outbox.ErrMisconfigured)
	}
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Qos(c.cfg.Prefetch, 0, false); err != nil {
		return false, fmt.Errorf("qos: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, c.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return false, fmt.Errorf("consume %s: %w", c.cfg.Queue, err)
	}
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	for {
		select {
		case <-ctx.Done():
			return consumed, nil
		case e := <-closed:
			return consumed, fmt.Errorf("connection closed: %w", e)
		case d, ok := <-deliveries:
			if !ok {
				return consumed, errors.New("the broker ended the consumer (queue deleted, or channel closed)")
			}
			if !c.deliver(ctx, work, d) {
				return consumed, nil // stopping
			}
			consumed = true
		}
	}
}

// deliver processes one delivery, retrying in place, and settles it. It reports false
// when the consumer stopped before the delivery was done.
func (c *Consumer) deliver(ctx, work context.Context, d amqp.Delivery) bool {
	log := c.cfg.Logger.With("queue", c.cfg.Queue, "message_id", d.MessageId, "delivery_tag", d.DeliveryTag)
	dec, err := Decode(d)
	if err != nil {
		log.ErrorContext(ctx, "rabbitmqtransport: consumer: rejecting a delivery that cannot be decoded (not requeued; a dead-letter exchange keeps it)", "error", err)
		_ = d.Reject(false)
		return true
	}
	msg := &dec.Message
	if _, err := c.in.Key(msg); err != nil {
		log.ErrorContext(ctx, "rabbitmqtransport: consumer: rejecting a delivery that has no inbox key (not requeued)", "error", err)
		_ = d.Reject(false)
		return true
	}
	pause := minPause
	for {
		res, err := c.in.Process(work, msg, func(ctx context.Context) error { return c.handle(ctx, &dec) })
		if err == nil {
			if c.cfg.Processed != nil {
				c.cfg.Processed(&dec, res)
			}
			if err := d.Ack(false); err != nil {
				log.WarnContext(ctx, "rabbitmqtransport: consumer: acknowledgement failed; the delivery comes again and is skipped as a duplicate", "error", err)
			}
			return true
		}
		if work.Err() != nil {
			return false
		}
		log.WarnContext(ctx, "rabbitmqtransport: consumer: delivery failed; retrying it in place", "error", err, "pause", pause)
		if !sleep(ctx, pause) {
			return false // left unacknowledged: the broker delivers it again
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
