package watermilltransport

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
)

// Handler returns a Watermill handler that applies each message's effects once
// through in: the message is decoded and handed to fn as an [inbox.Delivery] (its Raw
// is the *message.Message, Attempt 1), and fn runs in the inbox's unit of work with
// the insert of the message's key, under the message's context, by the inbox
// consumer's step for one delivery ([inbox.Inbox.Handle]). Register it with a router
// (router.AddNoPublisherHandler) or call it from a subscription loop.
//
// It returns nil when the unit committed or the message is a duplicate (the router
// then acknowledges it), and an error otherwise (the router nacks it and the
// subscriber redelivers it): fn's error, a failed commit, or, for a message that
// cannot be decoded or has no inbox key, an error wrapping [outbox.ErrInvalidMessage]
// that no redelivery can fix — divert those with Watermill's PoisonQueueWithFilter
// middleware (errors.Is(err, outbox.ErrInvalidMessage)). Retries, their backoff and
// the order of messages are the router's and the subscriber's.
//
// Once per message holds within the inbox's retention, and as far as the router
// acknowledges only after the handler returned (Watermill's routers do).
func Handler(in *inbox.Inbox, fn inbox.Handler) (message.NoPublishHandlerFunc, error) {
	switch {
	case in == nil:
		return nil, fmt.Errorf("%w: watermilltransport: Handler needs an *inbox.Inbox (inbox.New on the store fn writes to)", outbox.ErrMisconfigured)
	case fn == nil:
		return nil, fmt.Errorf("%w: watermilltransport: Handler needs an inbox.Handler", outbox.ErrMisconfigured)
	}
	return func(msg *message.Message) error {
		d, err := Decode(msg)
		if err != nil {
			return err
		}
		_, err = in.Handle(msg.Context(), &inbox.Delivery{ID: d.ID, Message: d.Message, Attempt: 1, Raw: msg}, fn)
		return err
	}, nil
}
