package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/outboxtest"
)

// countingTerminal records how many sends reached the end of a route.
type countingTerminal struct{ calls atomic.Int64 }

func (c *countingTerminal) Send(context.Context, outbox.Message) error {
	c.calls.Add(1)
	return nil
}

func newOutbox(t *testing.T, store outbox.Store, cfg middleware.Config) *middleware.Outbox {
	t.Helper()
	ob, err := middleware.NewOutbox(store, cfg)
	require.NoError(t, err)
	return ob
}

func TestCaptureShortCircuitsTheRoute(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{})
	terminal := &countingTerminal{}
	after := &countingTerminal{}
	r := middleware.NewRouter()
	r.Handle("orders", terminal, ob.UseOutbox(), func(next middleware.Sender) middleware.Sender {
		return middleware.SenderFunc(func(ctx context.Context, msg outbox.Message) error {
			after.calls.Add(1)
			return next.Send(ctx, msg)
		})
	})

	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "orders", Payload: []byte("x")}))

	assert.Zero(t, terminal.calls.Load(), "terminal must not be called on a captured route")
	assert.Zero(t, after.calls.Load(), "middleware after capture must not be called")
	assert.Len(t, stored(t, store), 1)
}

func TestImmediateWritesToTheStore(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{})
	require.Equal(t, outbox.Immediate, ob.Mode())
	r := middleware.NewRouter()
	r.Handle("orders", nil, ob.UseOutbox())

	msg := outbox.Message{
		Topic:   "orders",
		Key:     []byte("order-7"),
		Payload: []byte(`{"id":7}`),
		Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}},
	}
	require.NoError(t, r.Send(t.Context(), msg))

	envs := stored(t, store)
	require.Len(t, envs, 1)
	env := envs[0]
	assert.Equal(t, "orders", env.Topic)
	assert.Equal(t, []byte("order-7"), env.Key)
	assert.Equal(t, []byte(`{"id":7}`), env.Payload)
	assert.Equal(t, store.BucketCount(), env.BucketCount)
	assert.Equal(t, outbox.BucketOf(&msg, env.ID, store.BucketCount()), env.Bucket)
	assert.Equal(t, outbox.Pending, env.Status)
	assert.Equal(t, []outbox.Header{
		{Key: "content-type", Value: []byte("application/json")},
		{Key: outbox.HeaderIdempotencyKey, Value: []byte(env.ID.String())},
	}, env.Headers)
}

func TestTransactionalStagesOnTheScope(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{Mode: outbox.Transactional})
	r := middleware.NewRouter()
	r.Handle("orders", nil, ob.UseOutbox())

	ctx, scope := outbox.NewScope(t.Context())
	defer scope.Release()
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("k"), Payload: []byte("a")}))
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("k"), Payload: []byte("b")}))

	assert.Empty(t, stored(t, store), "a transactional send must not write before the unit of work commits")
	staged := scope.Take()
	require.Len(t, staged, 2)
	assert.Equal(t, []byte("a"), staged[0].Payload)
	assert.Equal(t, []byte("b"), staged[1].Payload)
	assert.Equal(t, store.BucketCount(), staged[0].BucketCount)
}

func TestTransactionalWithoutScopeFails(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{Mode: outbox.Transactional})
	r := middleware.NewRouter()
	r.Handle("orders", nil, ob.UseOutbox())

	err := r.Send(t.Context(), outbox.Message{Topic: "orders", Payload: []byte("x")})
	require.ErrorIs(t, err, outbox.ErrNoScope)
	assert.Contains(t, err.Error(), `"orders"`)
	assert.Empty(t, stored(t, store))

	err = ob.Send(t.Context(), outbox.Message{Topic: "orders", Payload: []byte("x")})
	require.ErrorIs(t, err, outbox.ErrNoScope)
}

func TestStageOnReleasedScopeFails(t *testing.T) {
	t.Parallel()
	ob := newOutbox(t, newStore(t), middleware.Config{Mode: outbox.Transactional})
	ctx, scope := outbox.NewScope(t.Context())
	scope.Release()
	err := ob.Send(ctx, outbox.Message{Topic: "orders"})
	require.ErrorIs(t, err, outbox.ErrClosed)
}

func TestModeOverriddenPerRoute(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{}) // Immediate
	r := middleware.NewRouter()
	r.Handle("audit", nil, ob.UseOutbox())
	r.Handle("orders", nil, ob.UseOutbox(middleware.WithMode(outbox.Transactional)))

	ctx, scope := outbox.NewScope(t.Context())
	defer scope.Release()
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "audit", Payload: []byte("a")}))
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Payload: []byte("o")}))

	envs := stored(t, store)
	require.Len(t, envs, 1)
	assert.Equal(t, "audit", envs[0].Topic)
	staged := scope.Take()
	require.Len(t, staged, 1)
	assert.Equal(t, "orders", staged[0].Topic)

	// The override works the other way round too.
	tx := newOutbox(t, store, middleware.Config{Mode: outbox.Transactional})
	r2 := middleware.NewRouter()
	r2.Handle("audit", nil, tx.UseOutbox(middleware.WithMode(outbox.Immediate)))
	require.NoError(t, r2.Send(t.Context(), outbox.Message{Topic: "audit", Payload: []byte("b")}))
	assert.Len(t, stored(t, store), 2)
}

func TestUnknownTopic(t *testing.T) {
	t.Parallel()
	r := middleware.NewRouter()
	r.Handle("orders", &countingTerminal{})
	err := r.Send(t.Context(), outbox.Message{Topic: "invoices"})
	require.ErrorIs(t, err, outbox.ErrNoRoute)
	assert.Contains(t, err.Error(), `"invoices"`)
	assert.Contains(t, err.Error(), "Router.Handle")
	assert.Equal(t, []string{"orders"}, r.Topics())
}

func TestRouteWithoutTerminal(t *testing.T) {
	t.Parallel()
	r := middleware.NewRouter()
	r.Handle("orders", nil)
	err := r.Send(t.Context(), outbox.Message{Topic: "orders"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "without a terminal")
}

func TestHandlePanicsOnMisuse(t *testing.T) {
	t.Parallel()
	r := middleware.NewRouter()
	r.Handle("orders", &countingTerminal{})
	assert.PanicsWithValue(t, `middleware: Router.Handle: topic "orders" is already registered`, func() {
		r.Handle("orders", &countingTerminal{})
	})
	assert.Panics(t, func() { r.Handle("", &countingTerminal{}) })
}

func TestChainOrder(t *testing.T) {
	t.Parallel()
	var order []string
	mark := func(name string) middleware.Middleware {
		return func(next middleware.Sender) middleware.Sender {
			return middleware.SenderFunc(func(ctx context.Context, msg outbox.Message) error {
				order = append(order, name)
				return next.Send(ctx, msg)
			})
		}
	}
	r := middleware.NewRouter(mark("shared"))
	r.Handle("t", middleware.SenderFunc(func(context.Context, outbox.Message) error {
		order = append(order, "terminal")
		return nil
	}), mark("first"), mark("second"))
	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "t"}))
	assert.Equal(t, []string{"shared", "first", "second", "terminal"}, order)
}

func TestOversizedMessageWritesNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.WriteMode{outbox.Immediate, outbox.Transactional} {
		t.Run(mode.String()+"/config limit", func(t *testing.T) {
			t.Parallel()
			store := newStore(t)
			ob := newOutbox(t, store, middleware.Config{Mode: mode, MaxMessageSize: 200})
			ctx, scope := outbox.NewScope(t.Context())
			defer scope.Release()

			err := ob.Send(ctx, outbox.Message{Topic: "orders", Payload: bytes.Repeat([]byte("x"), 300)})
			require.ErrorIs(t, err, outbox.ErrTooLarge)
			assert.Contains(t, err.Error(), "200")
			assert.Empty(t, stored(t, store))
			assert.Zero(t, scope.Len())

			// Just under the limit, counting the stamped idempotency key, is accepted.
			require.NoError(t, ob.Send(ctx, outbox.Message{Topic: "orders", Payload: bytes.Repeat([]byte("x"), 100)}))
		})
	}
	t.Run("store limit", func(t *testing.T) {
		t.Parallel()
		store := newLimitedStore(t, 64)
		ob := newOutbox(t, store, middleware.Config{MaxMessageSize: 1 << 20})
		assert.Equal(t, 64, ob.MaxMessageSize(), "the smaller limit applies")
		err := ob.Send(t.Context(), outbox.Message{Topic: "orders", Payload: bytes.Repeat([]byte("x"), 65)})
		require.ErrorIs(t, err, outbox.ErrTooLarge)
		assert.Empty(t, stored(t, store))
	})
}

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	t.Run("stamped with the message id", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		ob := newOutbox(t, store, middleware.Config{})
		require.NoError(t, ob.Send(t.Context(), outbox.Message{Topic: "orders"}))
		env := stored(t, store)[0]
		key, ok := env.Header(outbox.HeaderIdempotencyKey)
		require.True(t, ok)
		assert.Equal(t, env.ID.String(), string(key))
	})
	t.Run("kept when the application set one", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		ob := newOutbox(t, store, middleware.Config{})
		headers := []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("payment-42")}}
		require.NoError(t, ob.Send(t.Context(), outbox.Message{Topic: "orders", Headers: headers}))
		env := stored(t, store)[0]
		assert.Equal(t, headers, env.Headers)
	})
	t.Run("disabled", func(t *testing.T) {
		t.Parallel()
		store := newStore(t)
		ob := newOutbox(t, store, middleware.Config{DisableIdempotencyKey: true})
		require.NoError(t, ob.Send(t.Context(), outbox.Message{Topic: "orders"}))
		env := stored(t, store)[0]
		_, ok := env.Header(outbox.HeaderIdempotencyKey)
		assert.False(t, ok)
	})
}

func TestCallerHeadersAreNeverModified(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{})
	r := middleware.NewRouter(middleware.TraceContext(propagation.TraceContext{}), middleware.CorrelationID())
	r.Handle("orders", nil, ob.UseOutbox())

	// Spare capacity: an append in place would write into it unseen.
	backing := make([]outbox.Header, 1, 8)
	backing[0] = outbox.Header{Key: "a", Value: []byte("1")}
	ctx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t))
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Headers: backing}))

	full := backing[:cap(backing)]
	assert.Equal(t, outbox.Header{Key: "a", Value: []byte("1")}, full[0])
	for i := 1; i < len(full); i++ {
		assert.Zero(t, full[i], "header slot %d of the caller's array was written", i)
	}
	assert.Len(t, stored(t, store)[0].Headers, 4) // a, traceparent, correlation, idempotency
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

func TestTraceContextPropagated(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{})
	r := middleware.NewRouter()
	r.Handle("orders", nil, middleware.TraceContext(propagation.TraceContext{}), ob.UseOutbox())

	ts, err := trace.ParseTraceState("vendor=abc")
	require.NoError(t, err)
	ctx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t).WithTraceState(ts))
	stale := []outbox.Header{{Key: "traceparent", Value: []byte("00-stale")}}
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Headers: stale}))

	env := stored(t, store)[0]
	tp, ok := env.Header("traceparent")
	require.True(t, ok)
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", string(tp))
	tsHeader, ok := env.Header("tracestate")
	require.True(t, ok)
	assert.Equal(t, "vendor=abc", string(tsHeader))
	n := 0
	for _, h := range env.Headers {
		if h.Key == "traceparent" {
			n++
		}
	}
	assert.Equal(t, 1, n, "the propagated traceparent replaces the stale one")

	// The header extracts back to the same span context on the consumer side.
	carrier := propagation.MapCarrier{"traceparent": string(tp), "tracestate": string(tsHeader)}
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), carrier))
	assert.Equal(t, testSpanContext(t).TraceID(), got.TraceID())
	assert.Equal(t, testSpanContext(t).SpanID(), got.SpanID())
}

func TestTraceContextWithoutPropagatorIsANoOp(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{DisableIdempotencyKey: true})
	r := middleware.NewRouter()
	// nil: the global propagator, which is a no-op because this test binary installs none.
	r.Handle("orders", nil, middleware.TraceContext(nil), ob.UseOutbox())
	ctx := trace.ContextWithSpanContext(t.Context(), testSpanContext(t))
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders"}))
	assert.Empty(t, stored(t, store)[0].Headers)

	// A real propagator without a span on the context writes nothing either.
	store2 := newStore(t)
	ob2 := newOutbox(t, store2, middleware.Config{DisableIdempotencyKey: true})
	r2 := middleware.NewRouter()
	r2.Handle("orders", nil, middleware.TraceContext(propagation.TraceContext{}), ob2.UseOutbox())
	require.NoError(t, r2.Send(t.Context(), outbox.Message{Topic: "orders"}))
	assert.Empty(t, stored(t, store2)[0].Headers)
}

func TestCorrelationID(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{DisableIdempotencyKey: true})
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", nil, ob.UseOutbox())

	ctx := middleware.WithCorrelationID(t.Context(), "req-123")
	id, ok := middleware.CorrelationIDFrom(ctx)
	require.True(t, ok)
	require.Equal(t, "req-123", id)

	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("from-context")}))
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("app-set"),
		Headers: []outbox.Header{{Key: outbox.HeaderCorrelationID, Value: []byte("mine")}}}))
	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "orders", Key: []byte("fresh-1")}))
	require.NoError(t, r.Send(t.Context(), outbox.Message{Topic: "orders", Key: []byte("fresh-2")}))

	byKey := map[string]string{}
	for _, env := range stored(t, store) {
		v, ok := env.Header(outbox.HeaderCorrelationID)
		require.True(t, ok, "message %s has no correlation id", env.Key)
		byKey[string(env.Key)] = string(v)
	}
	assert.Equal(t, "req-123", byKey["from-context"])
	assert.Equal(t, "mine", byKey["app-set"])
	assert.NotEmpty(t, byKey["fresh-1"])
	assert.NotEqual(t, byKey["fresh-1"], byKey["fresh-2"], "each send without one gets a new id")
}

func TestScopeHandlerOpensAScopePerRequest(t *testing.T) {
	// Not parallel: it reads the process-wide abandoned counter.
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{Mode: outbox.Transactional})
	var scopes []*outbox.Scope
	h := middleware.ScopeHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope := outbox.ScopeFrom(r.Context())
		if scope == nil {
			http.Error(w, "no scope", http.StatusInternalServerError)
			return
		}
		scopes = append(scopes, scope)
		if err := ob.Send(r.Context(), outbox.Message{Topic: "orders"}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.URL.Path == "/commit" {
			scope.Take() // what a unit of work does inside its transaction
		}
		w.WriteHeader(http.StatusNoContent)
	}))

	before := outbox.AbandonedEnvelopes()
	for _, path := range []string{"/commit", "/forgot-to-commit"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, nil))
		require.Equal(t, http.StatusNoContent, rec.Code, rec.Body.String())
	}

	require.Len(t, scopes, 2)
	assert.NotSame(t, scopes[0], scopes[1], "each request gets its own scope")
	for _, s := range scopes {
		assert.ErrorIs(t, s.Stage(&outbox.Envelope{}), outbox.ErrClosed, "the scope is released when the handler returns")
	}
	assert.Equal(t, before+1, outbox.AbandonedEnvelopes(), "the uncommitted envelope is reported")
}

func TestScopeHandlerReleasesOnPanic(t *testing.T) {
	t.Parallel()
	var scope *outbox.Scope
	h := middleware.ScopeHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scope = outbox.ScopeFrom(r.Context())
		panic("boom")
	}))
	assert.Panics(t, func() {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	})
	require.NotNil(t, scope)
	assert.ErrorIs(t, scope.Stage(&outbox.Envelope{}), outbox.ErrClosed)
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := ob.Send(ctx, outbox.Message{Topic: "orders"})
	assert.Equal(t, context.Canceled, err, "context errors come back unwrapped")
	assert.Empty(t, stored(t, store))
}

func TestInvalidMessage(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{})
	err := ob.Send(t.Context(), outbox.Message{})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	assert.Empty(t, stored(t, store))
}

func TestNewOutboxValidation(t *testing.T) {
	t.Parallel()
	_, err := middleware.NewOutbox(nil, middleware.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "store")

	_, err = middleware.NewOutbox(newStore(t), middleware.Config{Mode: outbox.WriteMode(9)})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "Config.Mode")

	_, err = middleware.NewOutbox(newStore(t), middleware.Config{MaxMessageSize: -1})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "Config.MaxMessageSize")

	ob := newOutbox(t, newStore(t), middleware.Config{})
	assert.Panics(t, func() { ob.UseOutbox(middleware.WithMode(outbox.WriteMode(9))) })
}

func TestStoreErrorIsReturned(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	ob := newOutbox(t, store, middleware.Config{})
	require.NoError(t, store.Close())
	err := ob.Send(t.Context(), outbox.Message{Topic: "orders"})
	require.ErrorIs(t, err, outbox.ErrClosed)
	assert.True(t, strings.Contains(err.Error(), `"orders"`), err.Error())
}

func TestInlineRoutePublishesThroughTheTransport(t *testing.T) {
	t.Parallel()
	tr := outboxtest.NewRecorder()
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("metrics", middleware.Inline(tr))
	ctx := middleware.WithCorrelationID(t.Context(), "c-1")
	require.NoError(t, r.Send(ctx, outbox.Message{Topic: "metrics", Key: []byte("k"), Payload: []byte("v")}))

	got := tr.Messages()
	require.Len(t, got, 1)
	assert.Equal(t, "metrics", got[0].Topic)
	assert.Equal(t, []byte("k"), got[0].Key)
	assert.Equal(t, []byte("v"), got[0].Payload)
	cid, _ := got[0].Header(outbox.HeaderCorrelationID)
	assert.Equal(t, "c-1", string(cid))
	key, _ := got[0].Header(outbox.HeaderIdempotencyKey)
	assert.Equal(t, got[0].ID.String(), string(key))
}

func TestInlineRouteReturnsTheBrokersError(t *testing.T) {
	t.Parallel()
	broken := errors.New("broker unreachable")
	tr := outboxtest.NewRecorder()
	tr.FailWhen(func(*outbox.Envelope) error { return broken })
	r := middleware.NewRouter()
	r.Handle("metrics", middleware.Inline(tr))
	err := r.Send(t.Context(), outbox.Message{Topic: "metrics"})
	require.ErrorIs(t, err, broken)
	assert.Contains(t, err.Error(), `"metrics"`)
}
