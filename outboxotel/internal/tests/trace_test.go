package tests

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/middleware/tracecontext"
	outboxotel "github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// TestOneTraceFromCaptureToConsumer: one trace from the request that captured a message, through the store and the
// relay's publish, to the consumer that reads it back.
func TestOneTraceFromCaptureToConsumer(t *testing.T) {
	ctx := context.Background()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })

	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	capture, err := outbox.NewSender(store, outbox.SenderConfig{})
	require.NoError(t, err)
	router := middleware.NewRouter()
	router.Handle("orders", capture, outboxotel.CaptureSpans(tp), tracecontext.Stamp(propagation.TraceContext{}))

	// The application's request: a unit of work that sends one message.
	reqCtx, request := tp.Tracer("app").Start(ctx, "POST /orders")
	require.NoError(t, store.Transact(reqCtx, func(ctx context.Context) error {
		return router.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("o-1"), Payload: []byte(`{"id":1}`)})
	}))
	request.End()

	// The relay publishes it.
	obs, err := outboxotel.New(outboxotel.Config{TracerProvider: tp, MessagingSystem: "kafka"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	rec := outboxtest.NewRecorder()
	d, err := relay.New(store, rec, relay.Config{Observer: obs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Published)

	// The consumer reads the message back and continues the trace.
	msgs := rec.Messages()
	require.Len(t, msgs, 1)
	consumerCtx := outboxotel.Extract(ctx, msgs[0].Headers, nil)
	_, consume := tp.Tracer("consumer").Start(consumerCtx, "process orders", trace.WithSpanKind(trace.SpanKindConsumer))
	consume.End()

	spans := map[string]tracetest.SpanStub{}
	for _, s := range exporter.GetSpans() {
		spans[s.Name] = s
	}
	create, send, process := spans["create orders"], spans["send orders"], spans["process orders"]
	require.Equal(t, trace.SpanKindProducer, create.SpanKind)
	require.Equal(t, request.SpanContext().SpanID(), create.Parent.SpanID(), "capture is a span of the request")
	require.Equal(t, create.SpanContext.SpanID(), send.Parent.SpanID(), "the publish continues the capture")
	require.Equal(t, create.SpanContext.SpanID(), process.Parent.SpanID(), "the consumer continues the capture")
	for _, s := range []tracetest.SpanStub{create, send, process} {
		require.Equal(t, request.SpanContext().TraceID(), s.SpanContext.TraceID(), "%s is in the request's trace", s.Name)
	}
}
