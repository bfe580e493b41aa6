package tracecontext_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/middleware/tracecontext"
)

const incomingTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// A route with Stamp and CorrelationID that ends at the capture: the envelope stored
// by the unit of work carries the stamped headers, and the caller's header slice is
// never written to.
func TestStampedHeadersReachTheStoredEnvelope(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	sender := newSender(t, store, outbox.SenderConfig{})
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", sender, tracecontext.Stamp(propagation.TraceContext{}))

	ts, err := trace.ParseTraceState("vendor=abc")
	require.NoError(t, err)
	ctx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t).WithTraceState(ts))
	ctx = middleware.WithCorrelationID(ctx, "req-123")

	// Spare capacity: an append in place would write into it unseen. The stale
	// traceparent must be replaced, in a copy.
	backing := make([]outbox.Header, 2, 8)
	backing[0] = outbox.Header{Key: "content-type", Value: []byte("application/json")}
	backing[1] = outbox.Header{Key: "traceparent", Value: []byte("00-stale")}
	want := append([]outbox.Header(nil), backing...)

	err = store.Transact(ctx, func(ctx context.Context) error {
		return r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-7"), Headers: backing})
	})
	require.NoError(t, err)

	full := backing[:cap(backing)]
	assert.Equal(t, want, full[:2], "the caller's headers are unchanged")
	for i := 2; i < len(full); i++ {
		assert.Zero(t, full[i], "slot %d of the caller's array was written", i)
	}

	envs := stored(t, store)
	require.Len(t, envs, 1)
	env := envs[0]
	// The application's header stays first; the stamped ones follow, each once (the
	// propagator decides the order of its own).
	require.NotEmpty(t, env.Headers)
	assert.Equal(t, backing[0], env.Headers[0])
	got := map[string]string{}
	for _, h := range env.Headers {
		require.Equal(t, 1, headerCount(env, h.Key), "header %s appears once", h.Key)
		got[h.Key] = string(h.Value)
	}
	assert.Equal(t, map[string]string{
		"content-type":             "application/json",
		"traceparent":              incomingTraceparent,
		"tracestate":               "vendor=abc",
		outbox.HeaderCorrelationID: "req-123",
	}, got)

	// A consumer extracts the same span context from the stored headers.
	carrier := propagation.MapCarrier{}
	for _, h := range env.Headers {
		carrier[h.Key] = string(h.Value)
	}
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	assert.Equal(t, testSpanContext(t).TraceID(), sc.TraceID())
	assert.Equal(t, testSpanContext(t).SpanID(), sc.SpanID())
	assert.Equal(t, "vendor=abc", sc.TraceState().String())
}

// The next Sender's error comes back through Stamp unchanged, so errors.Is works at
// the call site.
func TestStampReturnsTheNextError(t *testing.T) {
	t.Parallel()
	broken := errors.New("terminal failed")
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", outbox.SenderFunc(func(context.Context, outbox.Message) error { return broken }),
		tracecontext.Stamp(propagation.TraceContext{}))
	ctx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t))
	require.ErrorIs(t, r.Send(ctx, outbox.Message{Topic: "orders"}), broken)
}

// A unit of work that fails stores nothing, stamped or not: the route adds headers,
// the unit decides what is written.
func TestStampedSendsRollBackWithTheUnit(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	r := middleware.NewRouter(tracecontext.Stamp(propagation.TraceContext{}), middleware.CorrelationID())
	r.Handle("orders", newSender(t, store, outbox.SenderConfig{}))
	failed := errors.New("card declined")
	ctx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t))
	err := store.Transact(ctx, func(ctx context.Context) error {
		if err := r.Send(ctx, outbox.Message{Topic: "orders"}); err != nil {
			return err
		}
		return failed
	})
	require.ErrorIs(t, err, failed)
	assert.Empty(t, stored(t, store))
}

func TestStampWithoutPropagatorOrSpanWritesNothing(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	sender := newSender(t, store, outbox.SenderConfig{Mode: outbox.Immediate})
	r := middleware.NewRouter()
	// nil: the global propagator, a no-op in this test binary when the parallel tests
	// run (TestGlobalPropagatorIsLookedUpAtEachSend restores it).
	r.Handle("no-propagator", sender, tracecontext.Stamp(nil))
	// A real propagator, but no span on the context.
	r.Handle("no-span", sender, tracecontext.Stamp(propagation.TraceContext{}))

	spanCtx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t))
	require.NoError(t, r.Send(spanCtx, outbox.Message{Topic: "no-propagator"}))
	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "no-span"}))
	envs := stored(t, store)
	require.Len(t, envs, 2)
	for _, env := range envs {
		assert.Empty(t, env.Headers, "topic %s", env.Topic)
	}
}

// Stamp(nil) and HTTP(nil) use the global propagator as it is at each send or
// request, so one installed after the routes and handlers were built still counts.
func TestGlobalPropagatorIsLookedUpAtEachSend(t *testing.T) {
	// Not parallel: it installs a process-wide propagator, then restores a no-op one
	// before the parallel tests run.
	store := newStore(t)
	r := middleware.NewRouter(tracecontext.Stamp(nil), middleware.CorrelationID())
	r.Handle("orders", newSender(t, store, outbox.SenderConfig{}))
	var sendErr error
	h := tracecontext.HTTP(nil)(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		sendErr = store.Transact(req.Context(), func(ctx context.Context) error {
			return r.Send(ctx, outbox.Message{Topic: "orders"})
		})
	}))

	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())

	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	req.Header.Set("traceparent", incomingTraceparent)
	h.ServeHTTP(httptest.NewRecorder(), req)
	require.NoError(t, sendErr)

	envs := stored(t, store)
	require.Len(t, envs, 1)
	tp, ok := envs[0].Header("traceparent")
	require.True(t, ok, "the global propagator extracted and injected the trace context")
	assert.Equal(t, incomingTraceparent, string(tp))
}

// HTTP extracts the incoming W3C trace context and takes X-Request-ID, in one
// wrapper; a handler that sends inside a unit of work through a route with Stamp and
// CorrelationID stores both on the message.
func TestHTTPCarriesTraceContextAndRequestID(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	r := middleware.NewRouter(tracecontext.Stamp(propagation.TraceContext{}), middleware.CorrelationID())
	r.Handle("orders", newSender(t, store, outbox.SenderConfig{}))

	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		err := store.Transact(req.Context(), func(ctx context.Context) error {
			return r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte(req.URL.Query().Get("id"))})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	h := tracecontext.HTTP(propagation.TraceContext{})(placeOrder)

	req := httptest.NewRequest(http.MethodPost, "/orders?id=with-headers", nil)
	req.Header.Set("traceparent", incomingTraceparent)
	req.Header.Set("tracestate", "vendor=abc")
	req.Header.Set(middleware.HeaderRequestID, "req-42")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	// A request with neither header: no trace context, a fresh correlation id.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/orders?id=bare", nil))
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	byKey := map[string]*driver.Envelope{}
	for _, env := range stored(t, store) {
		byKey[string(env.Key)] = env
	}
	require.Len(t, byKey, 2)

	env := byKey["with-headers"]
	tp, ok := env.Header("traceparent")
	require.True(t, ok)
	carrier := propagation.MapCarrier{"traceparent": string(tp)}
	if ts, ok := env.Header("tracestate"); ok {
		carrier["tracestate"] = string(ts)
	}
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", got.TraceID().String(), "the caller's trace id")
	assert.True(t, got.IsSampled())
	assert.Equal(t, "vendor=abc", got.TraceState().String())
	cid, ok := env.Header(outbox.HeaderCorrelationID)
	require.True(t, ok)
	assert.Equal(t, "req-42", string(cid), "X-Request-ID becomes the correlation id")

	bare := byKey["bare"]
	_, ok = bare.Header("traceparent")
	assert.False(t, ok, "no incoming trace context, none stamped")
	cid, ok = bare.Header(outbox.HeaderCorrelationID)
	require.True(t, ok)
	assert.NotEmpty(t, cid)
	assert.NotEqual(t, "req-42", string(cid))
}

// HTTP, like middleware.HTTP, refuses a nil handler when it is wrapped, at start-up.
func TestHTTPPanicsOnNilHandler(t *testing.T) {
	t.Parallel()
	wrap := tracecontext.HTTP(propagation.TraceContext{})
	assert.Panics(t, func() { wrap(nil) })
}
