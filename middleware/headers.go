package middleware

import (
	"context"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
)

type correlationKey struct{}

// WithCorrelationID returns a context whose sends carry id as their correlation id.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, correlationKey{}, id)
}

// CorrelationIDFrom returns the correlation id on ctx, if any.
func CorrelationIDFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(correlationKey{}).(string)
	return id, ok && id != ""
}

// CorrelationID stamps the [outbox.HeaderCorrelationID] header: a header the
// application set is kept; otherwise the id from [WithCorrelationID] on the context;
// otherwise a new random id, so every message can be followed across hops.
func CorrelationID() Middleware {
	return func(next outbox.Sender) outbox.Sender {
		return outbox.SenderFunc(func(ctx context.Context, msg outbox.Message) error {
			if _, ok := msg.Header(outbox.HeaderCorrelationID); !ok {
				id, ok := CorrelationIDFrom(ctx)
				if !ok {
					id = uuid.NewString()
				}
				msg.Headers = withHeader(msg.Headers, outbox.HeaderCorrelationID, []byte(id))
			}
			return next.Send(ctx, msg)
		})
	}
}

// withHeader returns headers plus one more, always in a new backing array so the
// caller's slice is never written to.
func withHeader(headers []outbox.Header, key string, value []byte) []outbox.Header {
	out := make([]outbox.Header, len(headers), len(headers)+1)
	copy(out, headers)
	return append(out, outbox.Header{Key: key, Value: value})
}
