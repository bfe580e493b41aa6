package tracecontext

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/middleware"
)

// Stamp returns route middleware that stamps the send's trace context on each message
// through p, the OpenTelemetry propagation API (for W3C: the traceparent and
// tracestate headers). A nil p uses the global propagator, looked up at each send so
// one installed later still counts; with none installed it writes nothing. A header
// the propagator writes replaces one of the same name.
func Stamp(p propagation.TextMapPropagator) middleware.Middleware {
	return func(next outbox.Sender) outbox.Sender {
		return outbox.SenderFunc(func(ctx context.Context, msg outbox.Message) error {
			prop := p
			if prop == nil {
				prop = otel.GetTextMapPropagator()
			}
			c := headerCarrier{headers: msg.Headers}
			prop.Inject(ctx, &c)
			msg.Headers = c.headers
			return next.Send(ctx, msg)
		})
	}
}

// headerCarrier exposes message headers to a propagator. The first Set copies the
// headers, so the caller's slice is never written to.
type headerCarrier struct {
	headers []outbox.Header
	copied  bool
}

var _ propagation.TextMapCarrier = (*headerCarrier)(nil)

func (c *headerCarrier) Get(key string) string {
	for i := len(c.headers) - 1; i >= 0; i-- {
		if c.headers[i].Key == key {
			return string(c.headers[i].Value)
		}
	}
	return ""
}

func (c *headerCarrier) Set(key, value string) {
	if !c.copied {
		c.headers = append(make([]outbox.Header, 0, len(c.headers)+2), c.headers...)
		c.copied = true
	}
	kept := c.headers[:0]
	for _, h := range c.headers {
		if h.Key != key {
			kept = append(kept, h)
		}
	}
	c.headers = append(kept, outbox.Header{Key: key, Value: []byte(value)})
}

func (c *headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c.headers))
	for _, h := range c.headers {
		keys = append(keys, h.Key)
	}
	return keys
}
