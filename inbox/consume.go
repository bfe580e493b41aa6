package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
)

// Handler applies the effects of one delivered message. It runs inside the inbox's
// unit of work: write with ctx through the store's accessors and send with ctx, and
// everything commits with the message's inbox key. Return an error to roll back; the
// message is then retried (see [Consumer]).
type Handler func(ctx context.Context, d *Delivery) error

// Delivery is a message a broker delivered, decoded back into what the outbox sent.
// Every transport's [Source] hands out the same shape.
type Delivery struct {
	// ID is the message id, from the [outbox.HeaderMessageID] header (zero when the
	// message has none: Kafka passes such a record on when the inbox can still key
	// it). Message.ID stays zero, so a message built from the Delivery to send
	// onwards gets an id of its own.
	ID uuid.UUID
	// Message holds the topic (the stream on Redis, empty on SQS), key (nil for a
	// keyless message), payload (nil for a tombstone), every header in the order the
	// outbox sent them (the stamped ones included) and, on Kafka, the partition.
	outbox.Message
	// Attempt counts the consumer's attempts at this delivery, from 1: a handler that
	// failed runs again, in place, with Attempt 2, 3 and so on. A redelivery by the
	// broker starts again from 1 (see Redelivered).
	Attempt int
	// Redelivered reports that the broker delivered the message before: AMQP's
	// redelivered flag, JetStream's delivery count, SQS's receive count, a Redis entry
	// pending from an earlier read. False where the broker does not say (Kafka,
	// Watermill).
	Redelivered bool
	// Raw is the broker's own message, for what a Delivery does not carry (a Kafka
	// offset, a NATS subject, an AMQP routing key): a *kgo.Record, a jetstream.Msg, an
	// amqp.Delivery, an SQS types.Message, a redis.XMessage or a Watermill
	// *message.Message. Read it; never acknowledge it yourself: the consumer does.
	Raw any

	// err is why the message could not be decoded (see Undecodable).
	err error
}

// Undecodable returns the Delivery a [Source] hands out for a message it cannot
// decode: raw is the broker's message and err why. The consumer never runs its
// handler on it: it rejects it ([Source.Reject]) and logs err.
func Undecodable(raw any, err error) *Delivery {
	if err == nil {
		err = errors.New("undecodable")
	}
	return &Delivery{Raw: raw, err: err}
}

// Source is a broker's side of a [Consumer]: it receives messages and settles them.
// Each transport has one (kafkatransport.Source, natstransport.Source,
// rabbitmqtransport.Source, redistransport.Source, sqstransport.Source), built on a
// client the application made. A Source serves one Consumer, one Run at a time: Run
// is the only caller of its methods, Reject (and [Extender.Extend]) from as many
// goroutines as a batch has lanes, the others from Run's goroutine.
//
// A source that can also keep a failing message while it is retried implements
// [Extender]; one that holds something for the length of a Run (a connection, a
// pull in flight) implements [Stopper].
type Source interface {
	// Receive waits, for a bounded time so that a stop is noticed, for the next
	// messages and returns them in lanes: a lane's deliveries are processed one at a
	// time, in order, and lanes concurrently (a Kafka partition or an SQS message
	// group is a lane; a broker processed in order returns one lane). It returns no
	// lane when nothing came, and a message it cannot decode as [Undecodable].
	// Run passes its own ctx.
	//
	// An error wrapping [outbox.ErrMisconfigured] or [outbox.ErrClosed] ends Run with
	// it; Run logs any other and calls Receive again after the retry backoff.
	Receive(ctx context.Context) ([][]*Delivery, error)
	// Ack acknowledges the deliveries of a batch whose units of work committed or that
	// were duplicates: after every lane of what Receive returned is done, or the
	// consumer stopped, each lane's deliveries in order, lane after lane. Run calls it
	// after every Receive that succeeded, with no delivery when none was done; a
	// source that acknowledges each message at once returns one delivery at a time.
	// An error is logged: the messages come again, and the inbox finds them
	// duplicates.
	Ack(ctx context.Context, ds []*Delivery) error
	// Reject settles a delivery that can never be processed, undecodable or without an
	// inbox key (cause says which): it terminates, dead-letters or acknowledges it
	// unprocessed, as the broker allows, and the lane goes on. An error means the
	// message stays with the broker, to be delivered again: its lane stops there.
	Reject(ctx context.Context, d *Delivery, cause error) error
}

// Extender is a [Source] that must be told before a failed delivery is retried in
// place.
type Extender interface {
	// Extend keeps d from being redelivered while the consumer waits to retry it (on
	// NATS it restarts the server's AckWait). An error means the source cannot keep
	// it: the consumer leaves it to the broker, which delivers it again, and stops its
	// lane (SQS, whose queue redelivers after the visibility timeout).
	Extend(ctx context.Context, d *Delivery) error
}

// Stopper is a [Source] that holds something for the length of a Run: a
// connection, a pull in flight, messages read ahead.
type Stopper interface {
	// Stop is called once, last, as Run returns: the source lets go of what it holds,
	// leaving what it received but did not hand out with the broker (to be delivered
	// again), so that a later Run starts afresh.
	Stop()
}

// Defaults of [ConsumerConfig].
const (
	DefaultRetryBackoff    = 100 * time.Millisecond
	DefaultMaxRetryBackoff = 10 * time.Second
	DefaultStopTimeout     = 30 * time.Second
)

// ConsumerConfig configures a [Consumer].
type ConsumerConfig struct {
	// RetryBackoff is the pause after a delivery's first failure, doubled after each
	// further failure up to MaxRetryBackoff; the same pauses space the retries of a
	// failed receive. Defaults to DefaultRetryBackoff (100 ms) and
	// DefaultMaxRetryBackoff (10 s); a MaxRetryBackoff below RetryBackoff is raised
	// to it.
	RetryBackoff, MaxRetryBackoff time.Duration
	// StopTimeout bounds how long [Consumer.Run], once its ctx is done, lets the
	// deliveries in progress finish and be acknowledged; then their ctx is cancelled
	// too. Defaults to DefaultStopTimeout (30 s).
	StopTimeout time.Duration
	// Processed, if set, is called after a delivery's unit of work committed (or it
	// was found a duplicate) and before it is acknowledged, from the goroutine of its
	// lane. Defaults to nil.
	Processed func(d *Delivery, res Result)
	// Logger receives failed deliveries and receives, rejected deliveries and failed
	// acknowledgements. Defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c ConsumerConfig) Validate() error {
	switch {
	case c.RetryBackoff < 0:
		return fmt.Errorf("%w: inbox: ConsumerConfig.RetryBackoff %v is negative: use 0 for the default (%v)", outbox.ErrMisconfigured, c.RetryBackoff, DefaultRetryBackoff)
	case c.MaxRetryBackoff < 0:
		return fmt.Errorf("%w: inbox: ConsumerConfig.MaxRetryBackoff %v is negative: use 0 for the default (%v)", outbox.ErrMisconfigured, c.MaxRetryBackoff, DefaultMaxRetryBackoff)
	case c.StopTimeout < 0:
		return fmt.Errorf("%w: inbox: ConsumerConfig.StopTimeout %v is negative: use 0 for the default (%v)", outbox.ErrMisconfigured, c.StopTimeout, DefaultStopTimeout)
	}
	return nil
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.MaxRetryBackoff == 0 {
		c.MaxRetryBackoff = DefaultMaxRetryBackoff
	}
	c.MaxRetryBackoff = max(c.MaxRetryBackoff, c.RetryBackoff)
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Consumer is the consume loop of every broker: it receives from a [Source], runs
// each delivery's [Handler] through an [Inbox] and acknowledges the delivery only
// after its unit of work committed.
//
// # Semantics
//
//   - A lane's deliveries are processed one at a time, in the order received; the
//     lanes of one receive concurrently (Kafka: partitions; SQS: message groups, or
//     every message of a standard queue; the other brokers have one lane). The next
//     receive starts when every lane of the last one is done and acknowledged.
//   - A delivery is acknowledged after its unit committed, and so is a duplicate.
//     A crash, a failed acknowledgement or a rebalance redelivers deliveries whose
//     units committed: the inbox finds their keys, so their effects are applied once
//     (within the inbox's retention).
//   - A delivery whose handler (or unit of work) fails is retried in place, after
//     RetryBackoff doubling up to MaxRetryBackoff, and holds back the rest of its
//     lane: order is kept. A source that cannot keep a message meanwhile (SQS) leaves
//     it to the broker's redelivery instead, with the rest of its lane.
//   - A delivery that cannot be decoded or has no inbox key (no idempotency-key or
//     message id header and no [Config.KeyFunc]) can never be processed: it is
//     rejected ([Source.Reject]: terminated, dead-lettered or acknowledged
//     unprocessed, as the broker allows) and logged at ERROR.
//   - A failed receive is logged and retried after the same backoff; one that
//     reports a misconfiguration or a closed client ends Run with its error.
//   - [Consumer.Run] returns when its ctx is done: it receives no more, lets the
//     deliveries in progress finish and be acknowledged within StopTimeout (then
//     cancels their ctx), and returns nil. No goroutine outlives it. What was
//     received but not processed stays with the broker, which delivers it again.
//
// # Limitations
//
//   - A delivery that always fails holds its lane (and, as receives wait for every
//     lane, the consumer) until it is fixed or removed: the consumer does not give up
//     after a number of attempts. Make the handler skip what it can never apply.
//   - Effects outside the unit of work may happen again: see the package
//     documentation.
type Consumer struct {
	src     Source
	in      *Inbox
	handle  Handler
	cfg     ConsumerConfig
	running atomic.Bool
}

// NewConsumer returns a consume loop that receives from src and applies each
// delivery's effects once through in with handle. It fails with an error wrapping
// [outbox.ErrMisconfigured] when an argument is missing or cfg is invalid.
func NewConsumer(src Source, in *Inbox, handle Handler, cfg ConsumerConfig) (*Consumer, error) {
	switch {
	case src == nil:
		return nil, fmt.Errorf("%w: inbox: NewConsumer needs a Source (the transport's NewSource on the application's client)", outbox.ErrMisconfigured)
	case in == nil:
		return nil, fmt.Errorf("%w: inbox: NewConsumer needs an *inbox.Inbox (inbox.New on the store the handler writes to)", outbox.ErrMisconfigured)
	case handle == nil:
		return nil, fmt.Errorf("%w: inbox: NewConsumer needs a Handler", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Consumer{src: src, in: in, handle: handle, cfg: cfg.withDefaults()}, nil
}

// Run consumes until ctx is done, then stops gracefully (see [Consumer]) and returns
// nil. It returns the source's error when it reports a misconfiguration or a closed
// client, and an error wrapping [outbox.ErrMisconfigured] when the Consumer runs
// already.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return fmt.Errorf("%w: inbox: Consumer.Run called while it runs: run one Run per Consumer (and per Source) at a time", outbox.ErrMisconfigured)
	}
	defer c.running.Store(false)
	if s, ok := c.src.(Stopper); ok {
		defer s.Stop()
	}
	work, stop := c.workContext(ctx)
	defer stop()

	pause := c.cfg.RetryBackoff
	for ctx.Err() == nil {
		lanes, err := c.src.Receive(ctx)
		if err != nil {
			if errors.Is(err, outbox.ErrMisconfigured) || errors.Is(err, outbox.ErrClosed) {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			c.cfg.Logger.WarnContext(ctx, "inbox: consumer: receive failed; retrying", "consumer", c.in.Consumer(), "error", err, "pause", pause)
			if !sleep(ctx, pause) {
				return nil
			}
			pause = min(2*pause, c.cfg.MaxRetryBackoff)
			continue
		}
		pause = c.cfg.RetryBackoff
		c.batch(ctx, work, lanes)
	}
	return nil
}

// workContext returns the ctx the deliveries run with: it outlives ctx by
// StopTimeout at most. stop releases it and waits for its timer's goroutine.
func (c *Consumer) workContext(ctx context.Context) (work context.Context, stop func()) {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		t := time.NewTimer(c.cfg.StopTimeout)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-done:
		}
	})
	return work, func() {
		close(done)
		wg.Wait()
		cancel()
	}
}

// batch processes what one Receive returned, each lane in its goroutine, and then
// acknowledges what was done.
func (c *Consumer) batch(ctx, work context.Context, lanes [][]*Delivery) {
	done := make([][]*Delivery, len(lanes))
	if len(lanes) == 1 {
		done[0] = c.lane(ctx, work, lanes[0])
	} else {
		var wg sync.WaitGroup
		for i, lane := range lanes {
			wg.Go(func() { done[i] = c.lane(ctx, work, lane) })
		}
		wg.Wait()
	}
	ds := slices.Concat(done...)
	if err := c.src.Ack(work, ds); err != nil {
		c.cfg.Logger.WarnContext(ctx, "inbox: consumer: acknowledgement failed; the messages come again and are skipped as duplicates", "consumer", c.in.Consumer(), "messages", len(ds), "error", err)
	}
}

// lane processes a lane's deliveries in order and returns those to acknowledge. It
// stops at the first delivery left with the broker, and when ctx is done.
func (c *Consumer) lane(ctx, work context.Context, lane []*Delivery) (done []*Delivery) {
	for _, d := range lane {
		if ctx.Err() != nil {
			return done
		}
		switch c.deliver(ctx, work, d) {
		case processed:
			done = append(done, d)
		case rejected:
		case left:
			return done
		}
	}
	return done
}

type outcome int

const (
	processed outcome = iota // its unit committed, or it is a duplicate: acknowledge it
	rejected                 // never processable, and settled by the source
	left                     // with the broker, to come again: its lane stops
)

// deliver runs one delivery through the inbox, retrying it in place until its unit
// commits or the consumer stops.
func (c *Consumer) deliver(ctx, work context.Context, d *Delivery) outcome {
	log := c.cfg.Logger.With("consumer", c.in.Consumer(), "message_id", d.ID)
	if d.Topic != "" {
		log = log.With("topic", d.Topic)
	}
	if cause := c.in.unprocessable(d); cause != nil {
		if err := c.src.Reject(work, d, cause); err != nil {
			log.ErrorContext(ctx, "inbox: consumer: a message that can never be processed stays with the broker; its lane stops", "error", cause, "reject", err)
			return left
		}
		log.ErrorContext(ctx, "inbox: consumer: rejected a message that can never be processed", "error", cause)
		return rejected
	}
	pause := c.cfg.RetryBackoff
	for d.Attempt = 1; ; d.Attempt++ {
		res, err := c.in.apply(work, d, c.handle)
		if err == nil {
			if c.cfg.Processed != nil {
				c.cfg.Processed(d, res)
			}
			return processed
		}
		if work.Err() != nil {
			return left
		}
		if x, ok := c.src.(Extender); ok {
			if xerr := x.Extend(work, d); xerr != nil {
				log.WarnContext(ctx, "inbox: consumer: message failed; left with the broker, which delivers it again", "attempt", d.Attempt, "error", err, "extend", xerr)
				return left
			}
		}
		log.WarnContext(ctx, "inbox: consumer: message failed; retrying it in place", "attempt", d.Attempt, "error", err, "pause", pause)
		if !sleep(ctx, pause) {
			return left
		}
		pause = min(2*pause, c.cfg.MaxRetryBackoff)
	}
}

// Handle is the consumer's step for one delivery, for a broker that pushes messages
// and settles them by the returned error (Watermill's router): it runs h for d once
// through [Inbox.Process] and returns its Result. A delivery that can never be
// processed (undecodable, or without a key) fails with an error wrapping
// [outbox.ErrInvalidMessage], which no redelivery fixes; any other error (h's, a
// failed commit) may pass on a redelivery. A duplicate is a nil error.
func (in *Inbox) Handle(ctx context.Context, d *Delivery, h Handler) (Result, error) {
	if h == nil {
		return Result{}, fmt.Errorf("%w: inbox: Handle needs a Handler", outbox.ErrMisconfigured)
	}
	if d == nil {
		return Result{}, fmt.Errorf("%w: inbox: no delivery", outbox.ErrInvalidMessage)
	}
	if err := in.unprocessable(d); err != nil {
		return Result{}, err
	}
	return in.apply(ctx, d, h)
}

// unprocessable reports why d can never be processed, wrapping
// [outbox.ErrInvalidMessage], or nil.
func (in *Inbox) unprocessable(d *Delivery) error {
	err := d.err
	if err == nil {
		_, err = in.Key(&d.Message)
	}
	if err == nil || errors.Is(err, outbox.ErrInvalidMessage) {
		return err
	}
	return fmt.Errorf("%w: %w", outbox.ErrInvalidMessage, err)
}

func (in *Inbox) apply(ctx context.Context, d *Delivery, h Handler) (Result, error) {
	return in.Process(ctx, &d.Message, func(ctx context.Context) error { return h(ctx, d) })
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
