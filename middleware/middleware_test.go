package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
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
	require.ErrorIs(t, err, middleware.ErrNoRoute)
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
	assert.Panics(t, func() { middleware.HTTP(nil) })
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
	passThrough := func(next outbox.Sender) outbox.Sender { return next }
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", outbox.SenderFunc(func(context.Context, outbox.Message) error { return broken }),
		passThrough)
	require.ErrorIs(t, r.Send(t.Context(), outbox.Message{Topic: "orders"}), broken)
}

// A route with CorrelationID that ends at the capture: the envelope stored by the
// unit of work carries the stamped header after the application's own, and the
// caller's header slice is never written to.
func TestStampedHeadersReachTheStoredEnvelope(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	sender := newSender(t, store, outbox.SenderConfig{})
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", sender)
	ctx := middleware.WithCorrelationID(t.Context(), "req-123")

	// Spare capacity: an append in place would write into it unseen.
	backing := make([]outbox.Header, 1, 8)
	backing[0] = outbox.Header{Key: "content-type", Value: []byte("application/json")}
	want := append([]outbox.Header(nil), backing...)

	err := store.Transact(ctx, func(ctx context.Context) error {
		return errors.Join(
			r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-7"), Headers: backing}),
			r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-8"), Headers: backing}),
		)
	})
	require.NoError(t, err)

	full := backing[:cap(backing)]
	assert.Equal(t, want, full[:1], "the caller's headers are unchanged")
	for i := 1; i < len(full); i++ {
		assert.Zero(t, full[i], "slot %d of the caller's array was written", i)
	}

	envs := stored(t, store)
	require.Len(t, envs, 2)
	for _, env := range envs {
		assert.Equal(t, []outbox.Header{
			backing[0],
			{Key: outbox.HeaderCorrelationID, Value: []byte("req-123")},
		}, env.Headers, "message %s: the application's header first, the stamped one after it, once", env.Key)
	}
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

// A route may end at a sender of another mode: an Immediate sender lets one
// route send outside a unit of work while the others refuse to. Inside a unit of work
// both routes join it, whatever their mode.
func TestRouteModeOverride(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	sender := newSender(t, store, outbox.SenderConfig{}) // Transactional
	immediate := newSender(t, store, outbox.SenderConfig{Mode: outbox.Immediate})
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", sender)
	r.Handle("audit", immediate)

	// Outside a unit of work.
	err := r.Send(t.Context(), outbox.Message{Topic: "orders", Key: []byte("outside")})
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

// HTTP takes X-Request-ID as the correlation id on the request's ctx; a handler that
// sends inside a unit of work through a route with CorrelationID stores it on the
// message. Trace-context headers on the request are not read.
func TestHTTPCarriesRequestID(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	r := middleware.NewRouter(middleware.CorrelationID())
	r.Handle("orders", newSender(t, store, outbox.SenderConfig{}))

	incoming := map[string]*http.Request{} // by key, as sent
	seen := map[string]string{}            // by key, the correlation id on the handler's ctx
	passedOn := map[string]bool{}          // by key, whether the handler got the request as sent
	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		key := req.URL.Query().Get("id")
		seen[key], _ = middleware.CorrelationIDFrom(req.Context())
		passedOn[key] = req == incoming[key]
		err := store.Transact(req.Context(), func(ctx context.Context) error {
			return r.Send(ctx, outbox.Message{Topic: "orders", Key: []byte(key)})
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	h := middleware.HTTP(placeOrder)

	req := httptest.NewRequest(http.MethodPost, "/orders?id=with-id", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	req.Header.Set(middleware.HeaderRequestID, "req-42")
	incoming["with-id"] = req
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
	_, ok := middleware.CorrelationIDFrom(req.Context())
	assert.False(t, ok, "the caller's request is not changed")

	// A request without X-Request-ID: no id on the ctx, a fresh correlation id.
	req = httptest.NewRequest(http.MethodPost, "/orders?id=bare", nil)
	incoming["bare"] = req
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())

	assert.Equal(t, map[string]string{"with-id": "req-42", "bare": ""}, seen, "X-Request-ID is on the handler's ctx")
	assert.Equal(t, map[string]bool{"with-id": false, "bare": true}, passedOn,
		"a request without X-Request-ID is passed on as it came")

	byKey := map[string]*driver.Envelope{}
	for _, env := range stored(t, store) {
		byKey[string(env.Key)] = env
	}
	require.Len(t, byKey, 2)

	env := byKey["with-id"]
	cid, ok := env.Header(outbox.HeaderCorrelationID)
	require.True(t, ok)
	assert.Equal(t, "req-42", string(cid), "X-Request-ID becomes the correlation id")
	_, ok = env.Header("traceparent")
	assert.False(t, ok, "trace context is the tracecontext package's business")

	cid, ok = byKey["bare"].Header(outbox.HeaderCorrelationID)
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
	tr.FailWhen(func(*driver.Envelope) error { return broken })
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
