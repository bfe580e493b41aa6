package natstransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// DefaultFetchBatch is the default of [SourceConfig.FetchBatch].
const DefaultFetchBatch = 16

// SourceConfig configures a [Source].
type SourceConfig struct {
	// FetchBatch is how many messages one pull asks for. Messages are processed one at
	// a time whatever it is; a larger batch only saves round trips. Keep it well under
	// the JetStream consumer's MaxAckPending. Defaults to DefaultFetchBatch (16).
	FetchBatch int
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c SourceConfig) Validate() error {
	return transportkit.Positive("natstransport", "SourceConfig.FetchBatch", c.FetchBatch, "the default")
}

// Source is JetStream's side of an [inbox.Consumer], which processes one message at
// a time in the order the JetStream consumer delivers them (the stream's), retries a
// failed one in place and acknowledges each after its unit of work committed. What
// is JetStream's own:
//
//   - It pulls from a pull consumer the caller created: a durable one, with
//     AckPolicy explicit. An acknowledgement is a DoubleAck: the server's
//     confirmation is awaited (5 s at most). A lost one leaves the message to come
//     again after AckWait, found a duplicate by the inbox.
//   - Before each retry in place it tells the server the message is in progress, so
//     its AckWait does not run out meanwhile; the JetStream consumer's MaxDeliver does
//     not apply, as the message is not redelivered.
//   - A message that cannot be decoded or has no inbox key is terminated (Term: never
//     redelivered).
//   - A failed pull (the connection is down, the consumer is missing) fails the
//     receive; the connection reconnects by itself. A pull waits a second at most, so
//     that a stop is noticed; when the consumer stops, messages pulled but not
//     processed are left unacknowledged, for the server to deliver after AckWait.
//   - A [inbox.Delivery]'s Raw is the jetstream.Msg; Redelivered says the server
//     delivered it before.
//
// For parallelism run several consumers on JetStream consumers filtered on different
// subjects (for order); two on one JetStream consumer share its messages and give up
// order.
type Source struct {
	cons jetstream.Consumer
	cfg  SourceConfig
	// batch is the pull in flight, read one message per Receive.
	batch jetstream.MessageBatch
}

// NewSource returns a source over cons, a pull consumer the caller created
// (stream.CreateOrUpdateConsumer with a Durable name and
// jetstream.AckExplicitPolicy). It fails with an error wrapping
// [outbox.ErrMisconfigured] when cons is missing or acknowledges otherwise, or cfg is
// invalid.
func NewSource(cons jetstream.Consumer, cfg SourceConfig) (*Source, error) {
	if err := transportkit.CheckArgs(cons == nil, "natstransport: NewSource needs a jetstream.Consumer (stream.CreateOrUpdateConsumer)", cfg); err != nil {
		return nil, err
	}
	if info := cons.CachedInfo(); info != nil && info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: natstransport: the JetStream consumer %q has ack policy %s: create it with AckPolicy jetstream.AckExplicitPolicy, so a message is acknowledged only after its unit of work committed", outbox.ErrMisconfigured, info.Name, info.Config.AckPolicy)
	}
	cfg.FetchBatch = cmp.Or(cfg.FetchBatch, DefaultFetchBatch)
	return &Source{cons: cons, cfg: cfg}, nil
}

// Receive returns the next message of the pull in flight, pulling anew when there is
// none; it returns nothing when a pull ends empty.
func (s *Source) Receive(ctx context.Context) ([][]*inbox.Delivery, error) {
	if s.batch == nil {
		batch, err := s.cons.Fetch(s.cfg.FetchBatch, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return nil, pullError(err)
		}
		s.batch = batch
	}
	select {
	case <-ctx.Done():
		return nil, nil // Stop drains the pull
	case msg, ok := <-s.batch.Messages():
		if ok {
			return [][]*inbox.Delivery{{delivery(msg)}}, nil
		}
	}
	err := s.batch.Error()
	s.batch = nil
	return nil, pullError(err)
}

// pullError is nil for a pull that merely ended.
func pullError(err error) error {
	if err == nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return fmt.Errorf("natstransport: pull: %w", err)
}

func delivery(msg jetstream.Msg) *inbox.Delivery {
	d, err := Decode(msg)
	meta, _ := msg.Metadata()
	return transportkit.Delivery(msg, d.ID, d.Message, meta != nil && meta.NumDelivered > 1, err)
}

// Ack acknowledges each message and waits for the server's confirmation.
func (s *Source) Ack(ctx context.Context, ds []*inbox.Delivery) error {
	var errs []error
	for _, d := range ds {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		errs = append(errs, d.Raw.(jetstream.Msg).DoubleAck(actx))
		cancel()
	}
	return errors.Join(errs...)
}

// Reject terminates the message: the server never delivers it again.
func (s *Source) Reject(_ context.Context, d *inbox.Delivery, _ error) error {
	// A failed Term leaves the message to come again after AckWait, rejected again.
	_ = d.Raw.(jetstream.Msg).Term()
	return nil
}

// Extend tells the server the message is in progress, restarting its AckWait.
func (s *Source) Extend(_ context.Context, d *inbox.Delivery) error {
	// If it fails, the message may come again meanwhile and be found a duplicate.
	_ = d.Raw.(jetstream.Msg).InProgress()
	return nil
}

// Stop drains the pull in flight, leaving its messages unacknowledged.
func (s *Source) Stop() {
	if s.batch != nil {
		for range s.batch.Messages() {
		}
		s.batch = nil
	}
}
