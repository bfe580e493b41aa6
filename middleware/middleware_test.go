package middleware_test

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
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/outboxtest"
)

// discard is a terminal that accepts every send.
var discard = outbox.SenderFunc(func(context.Context, outbox.Message) error { return nil })

func TestUnknownTopic(t *testing.T) {
	t.Parallel()
	r := middleware.NewRouter()
	r.Handle("orders", discard)
	r.Handle("audit", discard)

	err := r.Send(t.Context(), outbox.Message{Topic: "invoices"})
	require.ErrorIs(t, err, outbox.ErrNoRoute)
	assert.Contains(t, err.Error(), `"invoices"`)
	assert.Contains(t, err.Error(), "Router.Handle")
	assert.Equal(t, []string{"audit", "orders"}, r.Topics())
}

func TestHandlePanicsOnMisuse(t *testing.T) {
	t.Parallel()
	r := middleware.NewRouter()
	r.Handle("orders", discard)
	assert.PanicsWithValue(t, `middleware: Router.Handle: topic "orders" is already registered`, func() {
		r.Handle("orders", discard)
	})
	assert.PanicsWithValue(t, "middleware: Router.Handle with an empty topic", func() {
		r.Handle("", discard)
	})
	assert.Panics(t, func() { r.Handle("invoices", nil) }, "a route needs a terminal")
	assert.Equal(t, []string{"orders"}, r.Topics(), "a refused route is not registered")
}

func TestChainPanicsOnNilTerminal(t *testing.T) {
	t.Parallel()
	assert.Panics(t, func() { middleware.Chain(nil, middleware.CorrelationID()) })
	assert.Panics(t, func() { middleware.Chain(nil) })
	assert.Panics(t, func() { middleware.Inline(nil) })
}

func TestChainOrder(t *testing.T) {
	t.Parallel()
	var order []string
	mark := func(name string) middleware.Middleware {
		return func(next outbox.Sender) outbox.Sender {
			return outbox.SenderFunc(func(ctx context.Context, msg outbox.Message) error {
				order = append(order, name)
				return next.Send(ctx, msg)
			})
		}
	}
	terminal := outbox.SenderFunc(func(context.Context, outbox.Message) error {
		order = append(order, "terminal")
		return nil
	})

	r := middleware.NewRouter(mark("shared"))
	r.Handle("t", terminal, mark("first"), mark("second"))
	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "t"}))
	assert.Equal(t, []string{"shared", "first", "second", "terminal"}, order)

	order = nil
	require.NoError(t, middleware.Chain(terminal, mark("a"), mark("b")).Send(t.Context(), outbox.Message{Topic: "t"}))
	assert.Equal(t, []string{"a", "b", "terminal"}, order, "the first middleware is the outermost")
}

// The terminal's error comes back through the route unchanged, so errors.Is works
// at the call site.
func TestRouteReturnsTheTerminalsError(t *testing.T) {
	t.Parallel()
	broken := errors.New("terminal failed")
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", outbox.SenderFunc(func(context.Context, outbox.Message) error { return broken }),
		middleware.TraceContext(propagation.TraceContext{}))
	require.ErrorIs(t, r.Send(t.Context(), outbox.Message{Topic: "orders"}), broken)
}

func testSpanContext(t *testing.T) trace.SpanContext {
	t.Helper()
	traceID, err := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	require.NoError(t, err)
	spanID, err := trace.SpanIDFromHex("00f067aa0ba902b7")
	require.NoError(t, err)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled})
	require.True(t, sc.IsValid())
	return sc
}

// A route with TraceContext and CorrelationID that ends at the capture: the envelope
// stored by the unit of work carries the stamped headers, and the caller's header
// slice is never written to.
func TestStampedHeadersReachTheStoredEnvelope(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	sender := newSender(t, store, outbox.SenderConfig{})
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", sender, middleware.TraceContext(propagation.TraceContext{}))

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
		"traceparent":              "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
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

// A unit of work that fails stores nothing, stamped or not: the route adds headers,
// the unit decides what is written.
func TestStampedSendsRollBackWithTheUnit(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	r := middleware.NewRouter(middleware.TraceContext(propagation.TraceContext{}), middleware.CorrelationID())
	r.Handle("orders", newSender(t, store, outbox.SenderConfig{}))
	failed := errors.New("card declined")
	err := store.Transact(t.Context(), func(ctx context.Context) error {
		if err := r.Send(ctx, outbox.Message{Topic: "orders"}); err != nil {
			return err
		}
		return failed
	})
	require.ErrorIs(t, err, failed)
	assert.Empty(t, stored(t, store))
}

func TestTraceContextWithoutPropagatorOrSpanWritesNothing(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	sender := newSender(t, store, outbox.SenderConfig{Mode: outbox.Immediate})
	r := middleware.NewRouter()
	// nil: the global propagator, a no-op in this test binary when the parallel tests
	// run (TestGlobalPropagatorIsLookedUpAtEachSend restores it).
	r.Handle("no-propagator", sender, middleware.TraceContext(nil))
	// A real propagator, but no span on the context.
	r.Handle("no-span", sender, middleware.TraceContext(propagation.TraceContext{}))

	spanCtx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t))
	require.NoError(t, r.Send(spanCtx, outbox.Message{Topic: "no-propagator"}))
	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "no-span"}))
	envs := stored(t, store)
	require.Len(t, envs, 2)
	for _, env := range envs {
		assert.Empty(t, env.Headers, "topic %s", env.Topic)
	}
}

// TraceContext(nil) and HTTP(nil) use the global propagator as it is at each send or
// request, so one installed after the routes were built still counts.
func TestGlobalPropagatorIsLookedUpAtEachSend(t *testing.T) {
	// Not parallel: it installs a process-wide propagator, then restores a no-op one
	// before the parallel tests run.
	store := newStore(t)
	r := middleware.NewRouter(middleware.TraceContext(nil), middleware.CorrelationID())
	r.Handle("orders", newSender(t, store, outbox.SenderConfig{}))
	var sendErr error
	h := middleware.HTTP(nil)(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		sendErr = store.Transact(req.Context(), func(ctx context.Context) error {
			return r.Send(ctx, outbox.Message{Topic: "orders"})
		})
	}))

	otel.SetTextMapPropagator(propagation.TraceContext{})
	defer otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator())

	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	require.NoError(t, sendErr)

	envs := stored(t, store)
	require.Len(t, envs, 1)
	tp, ok := envs[0].Header("traceparent")
	require.True(t, ok, "the global propagator extracted and injected the trace context")
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", string(tp))
}

func TestCorrelationID(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", newSender(t, store, outbox.SenderConfig{}))

	ctx := middleware.WithCorrelationID(t.Context(), "req-123")
	id, ok := middleware.CorrelationIDFrom(ctx)
	require.True(t, ok)
	require.Equal(t, "req-123", id)
	_, ok = middleware.CorrelationIDFrom(middleware.WithCorrelationID(t.Context(), ""))
	require.False(t, ok, "an empty id is no id")

	err := store.Transact(ctx, func(ctx context.Context) error {
		return errors.Join(
			r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("from-context")}),
			r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("app-set"),
				Headers: []outbox.Header{{Key: outbox.HeaderCorrelationID, Value: []byte("mine")}}}),
		)
	})
	require.NoError(t, err)
	err = store.Transact(t.Context(), func(ctx context.Context) error { // no id on the context
		return errors.Join(
			r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("fresh-1")}),
			r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("fresh-2")}),
		)
	})
	require.NoError(t, err)

	byKey := map[string]string{}
	for _, env := range stored(t, store) {
		v, ok := env.Header(outbox.HeaderCorrelationID)
		require.True(t, ok, "message %s has no correlation id", env.Key)
		require.Equal(t, 1, headerCount(env, outbox.HeaderCorrelationID), "message %s", env.Key)
		byKey[string(env.Key)] = string(v)
	}
	require.Len(t, byKey, 4)
	assert.Equal(t, "req-123", byKey["from-context"])
	assert.Equal(t, "mine", byKey["app-set"], "a correlation id the application set is kept")
	assert.NotEmpty(t, byKey["fresh-1"])
	assert.NotEqual(t, byKey["fresh-1"], byKey["fresh-2"], "each send without one gets a new id")
}

// A route may override the capture's mode: Capture.WithMode(Immediate) lets one
// route send outside a unit of work while the others refuse to. Inside a unit of work
// both routes join it, whatever their mode.
func TestRouteModeOverride(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	sender := newSender(t, store, outbox.SenderConfig{}) // Transactional
	immediate, err := sender.WithMode(outbox.Immediate)
	require.NoError(t, err)
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", sender)
	r.Handle("audit", immediate)

	// Outside a unit of work.
	err = r.Send(t.Context(), outbox.Message{Topic: "orders", Key: []byte("outside")})
	require.ErrorIs(t, err, outbox.ErrNoTransaction, "the Transactional route refuses")
	assert.Contains(t, err.Error(), `"orders"`)
	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "audit", Key: []byte("outside")}))
	envs := stored(t, store)
	require.Len(t, envs, 1, "the Immediate route wrote at once")
	assert.Equal(t, "audit", envs[0].Topic)
	_, ok := envs[0].Header(outbox.HeaderCorrelationID)
	assert.True(t, ok, "the shared middleware ran on the overridden route")

	// Inside a unit of work that rolls back, neither route writes anything.
	failed := errors.New("rolled back")
	err = store.Transact(t.Context(), func(ctx context.Context) error {
		require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("rolled-back")}))
		require.NoError(t, r.Send(ctx, outbox.Message{Topic: "audit", Key: []byte("rolled-back")}))
		return failed
	})
	require.ErrorIs(t, err, failed)
	require.Len(t, stored(t, store), 1, "an Immediate route inside a unit of work rolls back with it")

	// Inside a unit of work that commits, both write.
	err = store.Transact(t.Context(), func(ctx context.Context) error {
		return errors.Join(
			r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("committed")}),
			r.Send(ctx, outbox.Message{Topic: "audit", Key: []byte("committed")}),
		)
	})
	require.NoError(t, err)
	got := map[string]int{}
	for _, env := range stored(t, store) {
		got[env.Topic+"/"+string(env.Key)]++
	}
	assert.Equal(t, map[string]int{"audit/outside": 1, "orders/committed": 1, "audit/committed": 1}, got)
}

// HTTP extracts the incoming W3C trace context and X-Request-ID; a handler that
// sends inside a unit of work through a route with TraceContext and CorrelationID
// stores them on the message.
func TestHTTPCarriesTraceContextAndRequestID(t *testing.T) {
	t.Parallel()
	const incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	store := newStore(t)
	r := middleware.NewRouter(middleware.TraceContext(propagation.TraceContext{}), middleware.CorrelationID())
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
	h := middleware.HTTP(propagation.TraceContext{})(placeOrder)

	req := httptest.NewRequest(http.MethodPost, "/orders?id=with-headers", nil)
	req.Header.Set("traceparent", incoming)
	req.Header.Set("tracestate", "vendor=abc")
	req.Header.Set(middleware.HeaderRequestID, "req-42")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	// A request with neither header: no trace context, a fresh correlation id.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/orders?id=bare", nil))
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	byKey := map[string]*outbox.Envelope{}
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

// Inline is a terminal that publishes through a transport at once; the route's
// middleware runs before it as before a capture.
func TestInlinePublishesThroughTheTransport(t *testing.T) {
	t.Parallel()
	tr := outboxtest.NewRecorder()
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("metrics", middleware.Inline(tr))
	ctx := middleware.WithCorrelationID(t.Context(), "c-1")
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "metrics", Key: []byte("k"), Payload: []byte("v")}))

	got := tr.Received("metrics")
	require.Len(t, got, 1)
	assert.Equal(t, []byte("k"), got[0].Key)
	assert.Equal(t, []byte("v"), got[0].Payload)
	assert.NotEmpty(t, got[0].ID, "the message has an id, as a captured one would")
	cid, ok := (&outbox.Message{Headers: got[0].Headers}).Header(outbox.HeaderCorrelationID)
	require.True(t, ok)
	assert.Equal(t, "c-1", string(cid))
	assert.Equal(t, 1, tr.Batches(), "one publish per send")

	err := r.Send(ctx, outbox.Message{Topic: "metrics", Key: []byte{0}, Headers: []outbox.Header{{Key: ""}}})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage, "an invalid message never reaches the transport")
	assert.Equal(t, 1, tr.Batches())
}

func TestInlineReturnsTheBrokersError(t *testing.T) {
	t.Parallel()
	broken := errors.New("broker unreachable")
	tr := outboxtest.NewRecorder()
	tr.FailWhen(func(*outbox.Envelope) error { return broken })
	r := middleware.NewRouter()
	r.Handle("metrics", middleware.Inline(tr))
	err := r.Send(t.Context(), outbox.Message{Topic: "metrics"})
	require.ErrorIs(t, err, broken)
	assert.Contains(t, err.Error(), `"metrics"`)
	assert.Zero(t, tr.Len())

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	assert.Equal(t, context.Canceled, r.Send(ctx, outbox.Message{Topic: "metrics"}), "a context error comes back unwrapped")
}
