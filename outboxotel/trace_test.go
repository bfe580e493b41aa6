package outboxotel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	outboxotel "github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// headers is a propagation carrier over message headers, as capture stamps them.
type headers struct{ h *[]outbox.Header }

func (c headers) Get(key string) string {
	for _, x := range *c.h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}
func (c headers) Set(key, value string) {
	*c.h = append(*c.h, outbox.Header{Key: key, Value: []byte(value)})
}
func (c headers) Keys() []string { return nil }

func TestProducerSpansContinueTheCapturedTrace(t *testing.T) {
	ctx := context.Background()
	exporter := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exporter))
	t.Cleanup(func() { _ = tp.Shutdown(ctx) })

	obs, err := outboxotel.New(outboxotel.Config{TracerProvider: tp, MessagingSystem: "kafka"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	store, err := memstore.New(memstore.Config{BucketCount: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })

	// The request that captured the message, with its trace context in the headers.
	reqCtx, request := tp.Tracer("app").Start(ctx, "POST /orders")
	traced := outbox.Message{Topic: "orders", Key: []byte("o-1"), Payload: []byte("{}")}
	propagation.TraceContext{}.Inject(reqCtx, headers{&traced.Headers})
	request.End()
	env, err := driver.NewEnvelope(traced, 2)
	require.NoError(t, err)
	untraced, err := driver.NewEnvelope(outbox.Message{Topic: "audit", Key: []byte("a-1"), Payload: []byte("{}")}, 2)
	require.NoError(t, err)
	refused, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte("o-2"), Payload: []byte("{}")}, 2)
	require.NoError(t, err)
	require.NoError(t, store.Driver().Enqueue(ctx, env, untraced, refused))
	rec := outboxtest.NewRecorder()
	rec.FailID(refused.ID, driver.Permanent(errors.New("message too large")), -1)

	d, err := relay.New(store, rec, relay.Config{Observer: obs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	before := time.Now()
	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Published)

	byID := map[string]tracetest.SpanStub{}
	for _, s := range exporter.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" {
				byID[a.Value.AsString()] = s
			}
		}
	}
	require.Len(t, byID, 3, "one producer span per message")

	s := byID[env.ID.String()]
	require.Equal(t, "send orders", s.Name)
	require.Equal(t, trace.SpanKindProducer, s.SpanKind)
	require.Equal(t, request.SpanContext().TraceID(), s.SpanContext.TraceID(), "the span continues the captured trace")
	require.Equal(t, request.SpanContext().SpanID(), s.Parent.SpanID(), "as a child of the capturing span")
	require.Contains(t, s.Attributes, attribute.String("messaging.system", "kafka"))
	require.Contains(t, s.Attributes, attribute.String("messaging.destination.name", "orders"))
	require.Equal(t, codes.Unset, s.Status.Code)
	require.False(t, s.StartTime.Before(before))
	require.False(t, s.EndTime.Before(s.StartTime))

	u := byID[untraced.ID.String()]
	require.False(t, u.Parent.IsValid(), "a message captured without a trace starts one")
	require.NotEqual(t, request.SpanContext().TraceID(), u.SpanContext.TraceID())

	f := byID[refused.ID.String()]
	require.Equal(t, codes.Error, f.Status.Code)
	require.Contains(t, f.Attributes, attribute.String("error.type", "permanent"))
}

// Each message's span carries its own failure, not the call's first.
func TestEachSpanCarriesItsOwnOutcome(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := outboxotel.New(outboxotel.Config{TracerProvider: tp})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	env := func() *driver.Envelope {
		e, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Payload: []byte("x")}, 4)
		require.NoError(t, err)
		return e
	}
	good, tooBig, later := env(), env(), env()
	perr := &driver.PublishError{Failed: []driver.MessageError{
		{ID: tooBig.ID, Err: driver.Permanent(errors.New("message too large"))},
		{ID: later.ID, Err: errors.New("leader not available")},
	}}
	obs.Published(context.Background(), []*driver.Envelope{good, tooBig, later}, []*driver.Envelope{good}, time.Now(), time.Millisecond, perr)
	want := map[string]string{good.ID.String(): "", tooBig.ID.String(): "permanent", later.ID.String(): "transient"}
	spans := exp.GetSpans()
	require.Len(t, spans, 3)
	for _, s := range spans {
		var id, typ string
		for _, kv := range s.Attributes {
			switch kv.Key {
			case "messaging.message.id":
				id = kv.Value.AsString()
			case "error.type":
				typ = kv.Value.AsString()
			}
		}
		require.Equal(t, want[id], typ, "span of %s", id)
		if typ == "" {
			require.Equal(t, codes.Unset, s.Status.Code)
		} else {
			require.Equal(t, codes.Error, s.Status.Code)
		}
	}
}
