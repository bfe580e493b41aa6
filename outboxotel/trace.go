package outboxotel

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// headerCarrier reads a message's headers as a propagation carrier (the last header
// of a name wins, as Message.Header does).
type headerCarrier []outbox.Header

func (h headerCarrier) Get(key string) string {
	for i := len(h) - 1; i >= 0; i-- {
		if h[i].Key == key {
			return string(h[i].Value)
		}
	}
	return ""
}

func (h headerCarrier) Set(string, string) {} // read only

func (h headerCarrier) Keys() []string {
	keys := make([]string, len(h))
	for i, x := range h {
		keys[i] = x.Key
	}
	return keys
}

func globalTracerProvider() trace.TracerProvider { return otel.GetTracerProvider() }

// tracing records the producer spans.
type tracing struct {
	tracer     trace.Tracer
	propagator propagation.TextMapPropagator
	system     string
}

func newTracing(cfg Config) *tracing {
	if cfg.TracerProvider == nil {
		return nil
	}
	p := cfg.Propagator
	if p == nil {
		p = propagation.TraceContext{}
	}
	return &tracing{tracer: cfg.TracerProvider.Tracer(ScopeName), propagator: p, system: cfg.MessagingSystem}
}

// published records one producer span per message of a publish call, continuing the
// trace context captured with the message (a root span when it carries none). The
// span covers the call: it starts when the call started and ends when it returned.
func (t *tracing) published(ctx context.Context, batch, acked []*driver.Envelope, start time.Time, took time.Duration, err error) {
	end := start.Add(took)
	var failed map[[16]byte]error
	if len(acked) < len(batch) {
		failed = failures(batch, acked, err)
	}
	for _, e := range batch {
		parent := t.propagator.Extract(context.WithoutCancel(ctx), headerCarrier(e.Headers))
		if !trace.SpanContextFromContext(parent).IsValid() {
			parent = trace.ContextWithSpanContext(parent, trace.SpanContext{}) // a new trace
		}
		attrs := []attribute.KeyValue{
			attribute.String("messaging.operation.name", "send"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", e.Topic),
			attribute.String("messaging.message.id", e.ID.String()),
			attribute.Int("messaging.batch.message_count", len(batch)),
			attribute.Int("outbox.bucket", e.Bucket),
			attribute.Int("outbox.attempt", e.Attempts+1),
		}
		if t.system != "" {
			attrs = append(attrs, attribute.String("messaging.system", t.system))
		}
		_, span := t.tracer.Start(parent, "send "+e.Topic,
			trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(start), trace.WithAttributes(attrs...))
		if cause, bad := failed[e.ID]; bad {
			span.SetAttributes(attribute.String("error.type", errorType(cause)))
			span.SetStatus(codes.Error, cause.Error())
		}
		span.End(trace.WithTimestamp(end))
	}
}
