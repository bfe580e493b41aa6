package middleware

import (
	"context"
	"fmt"

	"github.com/outboxkit/outbox"
)

// Inline returns a terminal that publishes each message straight away through t, as a
// batch of one, and returns the broker's answer. Nothing is stored: use it for routes
// that do not need the outbox. The message gets a message id and, unless it has one,
// an idempotency-key header equal to it, exactly as a captured message would.
func Inline(t outbox.Transport) Sender {
	if t == nil {
		panic("middleware: Inline with a nil transport")
	}
	return SenderFunc(func(ctx context.Context, msg outbox.Message) error {
		env, err := outbox.NewEnvelope(msg, outbox.DefaultBucketCount)
		if err != nil {
			return err
		}
		if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
			env.Headers = withHeader(env.Headers, outbox.HeaderIdempotencyKey, idempotencyKey(env))
		}
		if err := t.Publish(ctx, []*outbox.Envelope{env}); err != nil {
			if isContextErr(err) {
				return err
			}
			return fmt.Errorf("middleware: inline send on topic %q: %w", msg.Topic, err)
		}
		return nil
	})
}
