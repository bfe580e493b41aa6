package tracecontext_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/middleware/tracecontext"
	"github.com/outboxkit/outbox/store/memstore"
)

// Stamp writes the trace context on the send's ctx into the message, so the consumer
// continues the trace. With a nil propagator it uses the global one, installed at
// start-up with otel.SetTextMapPropagator(propagation.TraceContext{}).
func ExampleStamp() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})
	router := middleware.NewRouter(tracecontext.Stamp(propagation.TraceContext{}))
	router.Handle("orders", sender)

	// The span context of the operation that sends: usually the application's span.
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled}))

	err := store.Transact(ctx, func(ctx context.Context) error {
		return router.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-7")})
	})
	fmt.Println("unit of work:", err)

	envs, _ := store.Driver().(driver.Admin).List(ctx, driver.Pending, driver.Cursor{}, 10)
	tp, _ := envs[0].Header("traceparent")
	fmt.Println("traceparent:", string(tp))
	// Output:
	// unit of work: <nil>
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}

// HTTP carries an incoming request's W3C trace context and X-Request-ID to the
// messages its handler sends through a route with Stamp and CorrelationID. With a nil
// propagator HTTP and Stamp use the global one, installed at start-up with
// otel.SetTextMapPropagator(propagation.TraceContext{}).
func ExampleHTTP() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})
	w3c := propagation.TraceContext{}
	router := middleware.NewRouter(tracecontext.Stamp(w3c), middleware.CorrelationID())
	router.Handle("orders", sender)

	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := store.Transact(r.Context(), func(ctx context.Context) error {
			return router.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-7")})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	handler := tracecontext.HTTP(w3c)(placeOrder) // instead of middleware.HTTP, not around it

	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	req.Header.Set("X-Request-ID", "req-42")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)

	envs, _ := store.Driver().(driver.Admin).List(context.Background(), driver.Pending, driver.Cursor{}, 10)
	tp, _ := envs[0].Header("traceparent")
	cid, _ := envs[0].Header(outbox.HeaderCorrelationID)
	fmt.Println(rec.Code)
	fmt.Println("traceparent:", string(tp))
	fmt.Println("correlation id:", string(cid))
	// Output:
	// 201
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// correlation id: req-42
}
