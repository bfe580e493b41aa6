package middleware_test

import (
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/store/memory"
)

// BenchmarkCapture measures one send through a router into the outbox: Immediate mode
// enqueues into the memory store; Transactional mode stages on a scope, which is
// emptied every 100 sends, as a handler's unit of work would.
func BenchmarkCapture(b *testing.B) {
	payload := make([]byte, 256)
	msg := outbox.Message{
		Topic:   "orders",
		Key:     []byte("order-123"),
		Payload: payload,
		Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}},
	}

	b.Run("immediate", func(b *testing.B) {
		// A fresh store every 10,000 sends keeps the store's size, and so the cost of
		// its bookkeeping, the same however long the benchmark runs.
		var store *memory.Store
		var r *middleware.Router
		fresh := func() {
			if store != nil {
				_ = store.Close()
			}
			var err error
			if store, err = memory.New(memory.Config{}); err != nil {
				b.Fatal(err)
			}
			r = benchRouter(b, store, outbox.Immediate)
		}
		fresh()
		defer func() { _ = store.Close() }()
		ctx := b.Context()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if err := r.Send(ctx, msg); err != nil {
				b.Fatal(err)
			}
			if n++; n%10_000 == 0 {
				b.StopTimer()
				fresh()
				b.StartTimer()
			}
		}
	})

	b.Run("transactional", func(b *testing.B) {
		store, err := memory.New(memory.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		r := benchRouter(b, store, outbox.Transactional)
		ctx, scope := outbox.NewScope(b.Context())
		defer func() { scope.Take(); scope.Release() }() // leftovers are not abandoned sends
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if err := r.Send(ctx, msg); err != nil {
				b.Fatal(err)
			}
			if n++; n%100 == 0 {
				scope.Take()
			}
		}
	})
}

// BenchmarkCaptureStamped adds the stamping middleware (W3C trace context and a
// correlation id) in front of a transactional capture.
func BenchmarkCaptureStamped(b *testing.B) {
	store, err := memory.New(memory.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	ob, err := middleware.NewOutbox(store, middleware.Config{Mode: outbox.Transactional})
	if err != nil {
		b.Fatal(err)
	}
	r := middleware.NewRouter(middleware.TraceContext(propagation.TraceContext{}), middleware.CorrelationID())
	r.Handle("orders", nil, ob.UseOutbox())
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx := trace.ContextWithSpanContext(b.Context(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled}))
	ctx = middleware.WithCorrelationID(ctx, "req-1")
	ctx, scope := outbox.NewScope(ctx)
	defer func() { scope.Take(); scope.Release() }() // leftovers are not abandoned sends
	msg := outbox.Message{Topic: "orders", Key: []byte("order-123"), Payload: make([]byte, 256)}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if err := r.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
		if n++; n%100 == 0 {
			scope.Take()
		}
	}
}

func benchRouter(b *testing.B, store outbox.Store, mode outbox.WriteMode) *middleware.Router {
	b.Helper()
	ob, err := middleware.NewOutbox(store, middleware.Config{Mode: mode})
	if err != nil {
		b.Fatal(err)
	}
	r := middleware.NewRouter()
	r.Handle("orders", nil, ob.UseOutbox())
	return r
}
