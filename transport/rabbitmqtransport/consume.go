package rabbitmqtransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// DefaultPrefetch is the default of [SourceConfig.Prefetch].
const DefaultPrefetch = 16

// SourceConfig configures a [Source].
type SourceConfig struct {
	// Queue is the queue to consume. Required.
	Queue string
	// Prefetch is how many unacknowledged deliveries the broker sends ahead (basic.qos
	// on the source's channel). Deliveries are processed one at a time whatever it
	// is; a larger prefetch only saves round trips. Defaults to DefaultPrefetch (16).
	Prefetch int
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c SourceConfig) Validate() error {
	return cmp.Or(
		transportkit.Required("rabbitmqtransport", "SourceConfig.Queue", c.Queue, ""),
		transportkit.Between("rabbitmqtransport", "SourceConfig.Prefetch", c.Prefetch, 0, 65535, "AMQP takes 0 (the default) to 65535"),
	)
}

// Source is RabbitMQ's side of an [inbox.Consumer], which processes one delivery at
// a time in the order the broker delivers them (with one consumer on the queue, the
// queue's), retries a failed one in place and acknowledges each after its unit of
// work committed. What is RabbitMQ's own:
//
//   - It consumes the queue on connections its [Dialer] opens. When the connection
//     breaks, the receive fails and the next one dials again; unacknowledged
//     deliveries come back from the broker, and the inbox finds them duplicates.
//   - A delivery that cannot be decoded or has no inbox key is rejected without
//     requeueing: give the queue a dead-letter exchange to keep such messages.
//   - When the consumer stops, the source closes its connection: what the broker sent
//     ahead but was not processed goes back to the queue.
//   - A [inbox.Delivery]'s Raw is the amqp.Delivery (exchange, routing key,
//     properties); Redelivered is the broker's redelivered flag.
//
// The consumer does not dead-letter a message that keeps failing: it blocks its queue
// until it is fixed or removed. For parallelism run several consumers, on several
// queues (for order) or on one (giving up order).
type Source struct {
	dial Dialer
	cfg  SourceConfig

	// The session of the current run, open while conn is not nil.
	conn       *amqp.Connection
	deliveries <-chan amqp.Delivery
	closed     chan *amqp.Error
}

// NewSource returns a source over connections dial opens (see [Dialer]; NewSource
// itself does not dial). It fails with an error wrapping [outbox.ErrMisconfigured]
// when dial is missing or cfg is invalid.
func NewSource(dial Dialer, cfg SourceConfig) (*Source, error) {
	if err := transportkit.CheckArgs(dial == nil, "rabbitmqtransport: NewSource needs a Dialer", cfg); err != nil {
		return nil, err
	}
	cfg.Prefetch = cmp.Or(cfg.Prefetch, DefaultPrefetch)
	return &Source{dial: dial, cfg: cfg}, nil
}

// Receive returns the next delivery, dialing first when there is no connection. It
// fails when the connection breaks (the next Receive dials again), and with an
// error wrapping [outbox.ErrMisconfigured] for a connection with the client's own
// recovery.
func (s *Source) Receive(ctx context.Context) ([][]*inbox.Delivery, error) {
	if s.conn == nil {
		if err := s.open(ctx); err != nil {
			return nil, err
		}
	}
	select {
	case <-ctx.Done():
		return nil, nil
	case e := <-s.closed:
		s.Stop()
		return nil, fmt.Errorf("rabbitmqtransport: queue %s: connection closed: %w", s.cfg.Queue, e)
	case d, ok := <-s.deliveries:
		if !ok {
			s.Stop()
			return nil, fmt.Errorf("rabbitmqtransport: queue %s: the broker ended the consumer (queue deleted, or channel closed)", s.cfg.Queue)
		}
		dec, err := Decode(d)
		return [][]*inbox.Delivery{{transportkit.Delivery(d, dec.ID, dec.Message, d.Redelivered, err)}}, nil
	}
}

// open dials and starts consuming.
func (s *Source) open(ctx context.Context) (err error) {
	conn, err := s.dial(ctx)
	if err != nil {
		return fmt.Errorf("rabbitmqtransport: queue %s: dial: %w", s.cfg.Queue, err)
	}
	defer func() {
		if err != nil {
			_ = conn.Close()
		}
	}()
	if conn.IsRecoveryEnabled() {
		return fmt.Errorf("%w: rabbitmqtransport: dial returned a connection with amqp.Config.Recovery set: leave Recovery nil, the source reconnects by itself", outbox.ErrMisconfigured)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmqtransport: queue %s: open channel: %w", s.cfg.Queue, err)
	}
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("rabbitmqtransport: queue %s: qos: %w", s.cfg.Queue, err)
	}
	// ctx is the run's: when it ends, the broker stops sending ahead.
	deliveries, err := ch.ConsumeWithContext(ctx, s.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbitmqtransport: consume %s: %w", s.cfg.Queue, err)
	}
	s.conn, s.deliveries, s.closed = conn, deliveries, conn.NotifyClose(make(chan *amqp.Error, 1))
	return nil
}

// Ack acknowledges each delivery.
func (s *Source) Ack(_ context.Context, ds []*inbox.Delivery) error {
	var errs []error
	for _, d := range ds {
		errs = append(errs, d.Raw.(amqp.Delivery).Ack(false))
	}
	return errors.Join(errs...)
}

// Reject rejects the delivery without requeueing: a dead-letter exchange keeps it.
func (s *Source) Reject(_ context.Context, d *inbox.Delivery, _ error) error {
	// A failed reject leaves the delivery unacknowledged: it comes again after a
	// reconnection and is rejected then.
	_ = d.Raw.(amqp.Delivery).Reject(false)
	return nil
}

// Stop closes the connection; the broker requeues what it sent ahead.
func (s *Source) Stop() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn, s.deliveries, s.closed = nil, nil, nil
	}
}
