package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/store/memory"
)

// A route that captures into the outbox: the send is stored, not published, and a
// dispatcher relays it later.
func ExampleOutbox_UseOutbox() {
	ctx := context.Background()
	store, _ := memory.New(memory.Config{})
	defer store.Close()

	ob, err := middleware.NewOutbox(store, middleware.Config{}) // Immediate mode
	if err != nil {
		panic(err)
	}
	router := middleware.NewRouter(middleware.CorrelationID())
	router.Handle("orders", nil, middleware.TraceContext(nil), ob.UseOutbox())

	err = router.Send(middleware.WithCorrelationID(ctx, "req-1"),
		outbox.Message{Topic: "orders", Key: []byte("order-7"), Payload: []byte(`{"id":7}`)})
	fmt.Println("send:", err)

	stats, _ := store.Stats(ctx)
	pending := 0
	for _, n := range stats.Pending {
		pending += n
	}
	fmt.Println("pending in the outbox:", pending)

	env, _ := store.List(ctx, outbox.Pending, outbox.Cursor{}, 1)
	cid, _ := env[0].Header(outbox.HeaderCorrelationID)
	key, _ := env[0].Header(outbox.HeaderIdempotencyKey)
	fmt.Println("correlation id:", string(cid))
	fmt.Println("idempotency key is the message id:", string(key) == env[0].ID.String())
	// Output:
	// send: <nil>
	// pending in the outbox: 1
	// correlation id: req-1
	// idempotency key is the message id: true
}

// Transactional mode stages sends on the context's scope; the store's unit of work
// writes them together with the application's own change, or not at all.
func ExampleWithMode() {
	ctx := context.Background()
	store, _ := memory.New(memory.Config{})
	defer store.Close()
	ob, _ := middleware.NewOutbox(store, middleware.Config{})
	router := middleware.NewRouter()
	router.Handle("payments", nil, ob.UseOutbox(middleware.WithMode(outbox.Transactional)))

	// Without a scope, a transactional send is refused rather than lost.
	err := router.Send(ctx, outbox.Message{Topic: "payments"})
	fmt.Println("no scope:", errors.Is(err, outbox.ErrNoScope))

	balance := 100
	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	_ = router.Send(ctx, outbox.Message{Topic: "payments", Payload: []byte("capture 30")})
	err = store.Commit(ctx, func() error {
		balance -= 30 // the application's state change, atomic with the envelope
		return nil
	})
	fmt.Println("commit:", err, "balance:", balance)

	_ = router.Send(ctx, outbox.Message{Topic: "payments", Payload: []byte("capture 500")})
	err = store.Commit(ctx, func() error {
		return errors.New("insufficient funds") // rolls back: the envelope is discarded
	})
	fmt.Println("rollback:", err, "balance:", balance)

	envs, _ := store.List(ctx, outbox.Pending, outbox.Cursor{}, 10)
	fmt.Println("envelopes stored:", len(envs))
	// Output:
	// no scope: true
	// commit: <nil> balance: 70
	// rollback: insufficient funds balance: 70
	// envelopes stored: 1
}

// An unknown topic is an error that says how to fix it.
func ExampleRouter_Send() {
	router := middleware.NewRouter()
	err := router.Send(context.Background(), outbox.Message{Topic: "invoices"})
	fmt.Println(errors.Is(err, outbox.ErrNoRoute))
	fmt.Println(err)
	// Output:
	// true
	// outbox: no route for topic "invoices": register a route for it with Router.Handle before sending
}

// ScopeHandler gives every request its own scope; the handler commits what it staged
// through the store's unit of work.
func ExampleScopeHandler() {
	store, _ := memory.New(memory.Config{})
	defer store.Close()
	ob, _ := middleware.NewOutbox(store, middleware.Config{Mode: outbox.Transactional})

	var orders []string
	placeOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("id")
		if err := ob.Send(r.Context(), outbox.Message{Topic: "orders", Key: []byte(id)}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		err := store.Commit(r.Context(), func() error {
			orders = append(orders, id)
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	h := middleware.ScopeHandler(placeOrder)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/orders?id=7", nil))
	envs, _ := store.List(context.Background(), outbox.Pending, outbox.Cursor{}, 10)
	fmt.Println(rec.Code, orders, len(envs), string(envs[0].Key))
	// Output:
	// 201 [7] 1 7
}
