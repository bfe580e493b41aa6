package watermilltransport

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
)

// HandlerFunc applies the effects of one message. It runs inside the inbox's unit of
// work: write with ctx through the store's accessors and send with ctx, and
// everything commits with the message's inbox key. Return an error to roll back.
type HandlerFunc func(ctx context.Context, d *Delivery) error

// Handler returns a Watermill handler that applies each message's effects once
// through in: the message is decoded, and fn runs in the inbox's unit of work with
// the insert of the message's key, under the message's context. Register it with a
// router (router.AddNoPublisherHandler) or call it from a subscription loop.
//
// It returns nil when the unit committed or the message is a duplicate (the router
// then acknowledges it), and an error otherwise (the router nacks it and the
// subscriber redelivers it): fn's error, a failed commit, or, for a message that
// cannot be decoded or has no inbox key, an error wrapping [outbox.ErrInvalidMessage]
// that no redelivery can fix — divert those with Watermill's PoisonQueueWithFilter
// middleware (errors.Is(err, outbox.ErrInvalidMessage)).
//
// Once per message holds within the inbox's retention, and as far as the router
// acknowledges only after the handler returned (Watermill's routers do).
func Handler(in *inbox.Inbox, fn HandlerFunc) (message.NoPublishHandlerFunc, error) {
	switch {
	case in == nil:
		return nil, fmt.Errorf("%w: watermilltransport: Handler needs an *inbox.Inbox (inbox.New on the store fn writes to)", outbox.ErrMisconfigured)
	case fn == nil:
		return nil, fmt.Errorf("%w: watermilltransport: Handler needs a HandlerFunc", outbox.ErrMisconfigured)
	}
	return func(msg *message.Message) error {
		d, err := Decode(msg)
		if err != nil {
			return err
		}
		if _, err := in.Key(&d.Message); err != nil {
			return fmt.Errorf("watermilltransport: message %s: %w", msg.UUID, err)
		}
		_, err = in.Process(msg.Context(), &d.Message, func(ctx context.Context) error { return fn(ctx, &d) })
		return err
	}, nil
}
