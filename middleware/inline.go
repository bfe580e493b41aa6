package middleware

import (
	"context"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Inline returns a terminal that publishes each message straight away through t, as a
// batch of one, and returns the broker's answer. Nothing is stored: use it for routes
// that do not need the outbox. The message gets a message id exactly as a captured
// message would; the transport stamps it (and the idempotency key) as it does for
// relayed messages.
func Inline(t driver.Transport) outbox.Sender {
	if t == nil {
		panic("middleware: Inline with a nil transport")
	}
	return outbox.SenderFunc(func(ctx context.Context, msg outbox.Message) error {
		env, err := driver.NewEnvelope(msg, driver.DefaultBucketCount)
		if err != nil {
			return err
		}
		if err := t.Publish(ctx, []*driver.Envelope{env}); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("middleware: inline send on topic %q: %w", msg.Topic, err)
		}
		return nil
	})
}
