package tracecontext_test

import (
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/middleware/tracecontext"
	"github.com/outboxkit/outbox/store/memstore"
)

// BenchmarkCaptureStamped measures one send through a router with the stamping
// middleware (W3C trace context and a correlation id) to the capture on the memory
// store, staging on a scope emptied every 100 sends as middleware's
// BenchmarkCapture/staged does.
func BenchmarkCaptureStamped(b *testing.B) {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	if err != nil {
		b.Fatal(err)
	}
	r := middleware.NewRouter(tracecontext.Stamp(propagation.TraceContext{}), middleware.CorrelationID())
	r.Handle("orders", sender)
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(b.Context(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled}))
	ctx = middleware.WithCorrelationID(ctx, "req-1")
	ctx, scope := outbox.NewScope(ctx)
	defer func() { _, _ = driver.Take(ctx, 8); scope.Release() }() // leftovers are not abandoned sends
	msg := outbox.Message{Topic: "orders", Key: []byte("order-123"), Payload: make([]byte, 256)}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := r.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
		if n++; n%100 == 0 {
			_, _ = driver.Take(ctx, 8)
		}
	}
}
