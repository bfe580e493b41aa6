package outboxotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/middleware"
)

// CaptureSpans returns route middleware that records a span, "create TOPIC" (kind
// producer, messaging operation "create"), in the caller's trace around each send:
// the capture of the message into the outbox. Put it before
// tracecontext.Stamp in the route, so that the trace context stamped on the message
// is the create span's: the relay's publish spans (Config.TracerProvider) and the
// consumers ([Extract]) then continue from it, as the messaging conventions describe.
// A send that fails marks the span with an error status. tp nil uses
// otel.GetTracerProvider() at each send.
func CaptureSpans(tp trace.TracerProvider) middleware.Middleware {
	return func(next outbox.Sender) outbox.Sender {
		return outbox.SenderFunc(func(ctx context.Context, msg outbox.Message) error {
			provider := tp
			if provider == nil {
				provider = globalTracerProvider()
			}
			ctx, span := provider.Tracer(ScopeName).Start(ctx, "create "+msg.Topic,
				trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithAttributes(
					attribute.String("messaging.operation.name", "create"),
					attribute.String("messaging.operation.type", "create"),
					attribute.String("messaging.destination.name", msg.Topic),
				))
			defer span.End()
			err := next.Send(ctx, msg)
			if err != nil {
				span.SetStatus(codes.Error, err.Error())
			}
			return err
		})
	}
}

// Extract returns ctx carrying the trace context captured with a message, read from
// its headers through p (nil: propagation.TraceContext{}). Every transport's Decode
// gives the headers back as they were captured, so a consumer continues the
// producer's trace with:
//
//	d, err := kafkatransport.Decode(record)
//	ctx = outboxotel.Extract(ctx, d.Headers, nil)
//	ctx, span := tracer.Start(ctx, "process "+d.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
//
// A message without a trace context leaves ctx as it is.
func Extract(ctx context.Context, headers []outbox.Header, p propagation.TextMapPropagator) context.Context {
	if p == nil {
		p = propagation.TraceContext{}
	}
	return p.Extract(ctx, headerCarrier(headers))
}
