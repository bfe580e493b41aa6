package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/store/memstore"
)

// A router whose route ends at the capture: the route stamps a correlation id, the
// capture stages the message in the unit of work, and the store writes it when the
// unit commits. Handlers depend on outbox.Sender alone; the router is one.
func Example() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()

	sender, err := outbox.NewSender(store, outbox.SenderConfig{}) // Transactional
	if err != nil {
		panic(err)
	}
	router := middleware.NewRouter(middleware.CorrelationID())
	router.Handle("orders", sender)

	var send outbox.Sender = router
	ctx = middleware.WithCorrelationID(ctx, "req-1")
	err = store.Transact(ctx, func(ctx context.Context) error {
		// The application's own write would go here, through ctx.
		return send.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-7"), Payload: []byte(`{"id":7}`)})
	})
	fmt.Println("unit of work:", err)

	envs, _ := store.Driver().(driver.Admin).List(ctx, driver.Pending, driver.Cursor{}, 10)
	cid, _ := envs[0].Header(outbox.HeaderCorrelationID)
	fmt.Println("stored:", len(envs), envs[0].Topic, string(envs[0].Key))
	fmt.Println("correlation id:", string(cid))

	// Outside a unit of work the Transactional capture refuses the send.
	err = send.Send(ctx, outbox.Message{Topic: "orders"})
	fmt.Println("outside a unit of work:", errors.Is(err, outbox.ErrNoTransaction))
	// Output:
	// unit of work: <nil>
	// stored: 1 orders order-7
	// correlation id: req-1
	// outside a unit of work: true
}

// A route that may send without a transaction ends at a capture whose mode is
// overridden; the other routes keep refusing sends outside a unit of work.
func Example_routeMode() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})
	immediate, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate})

	router := middleware.NewRouter()
	router.Handle("payments", sender)
	router.Handle("audit", immediate)

	err := router.Send(ctx, outbox.Message{Topic: "payments"})
	fmt.Println("payments:", errors.Is(err, outbox.ErrNoTransaction))
	fmt.Println("audit:", router.Send(ctx, outbox.Message{Topic: "audit"}))

	envs, _ := store.Driver().(driver.Admin).List(ctx, driver.Pending, driver.Cursor{}, 10)
	fmt.Println("stored:", len(envs), envs[0].Topic)
	// Output:
	// payments: true
	// audit: <nil>
	// stored: 1 audit
}

// HTTP carries an incoming request's X-Request-ID to the messages its handler sends
// through a route with CorrelationID. For the trace context as well, wrap the handler
// in the tracecontext package's HTTP instead.
func ExampleHTTP() {
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})
	router := middleware.NewRouter(middleware.CorrelationID())
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
	handler := middleware.HTTP(placeOrder)

	req := httptest.NewRequest(http.MethodPost, "/orders", nil)
	req.Header.Set("X-Request-ID", "req-42")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)

	envs, _ := store.Driver().(driver.Admin).List(context.Background(), driver.Pending, driver.Cursor{}, 10)
	cid, _ := envs[0].Header(outbox.HeaderCorrelationID)
	fmt.Println(rec.Code)
	fmt.Println("correlation id:", string(cid))
	// Output:
	// 201
	// correlation id: req-42
}

// An unknown topic is an error that says how to fix it.
func ExampleRouter_Send() {
	router := middleware.NewRouter()
	err := router.Send(context.Background(), outbox.Message{Topic: "invoices"})
	fmt.Println(errors.Is(err, middleware.ErrNoRoute))
	fmt.Println(err)
	// Output:
	// true
	// middleware: no route for topic "invoices": register a route for it with Router.Handle before sending
}
