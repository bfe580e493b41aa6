package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// RunOnce is one sweep, as a scheduled function would run it: take the buckets, publish
// what is due, let go of the buckets.
func ExampleRelay_RunOnce() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	broker := outboxtest.NewRecorder()

	for _, id := range []string{"order-1", "order-2", "order-1"} {
		_ = store.Enqueue(ctx, outbox.Message{Topic: "orders", Key: []byte(id), Payload: []byte("placed")})
	}

	d, err := relay.New(store, broker, relay.Config{
		RelayID: "sweeper",
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := d.RunOnce(ctx)
	fmt.Println("published:", res.Published, "error:", err)
	for _, m := range broker.Messages() {
		fmt.Println(m.Topic, string(m.Key))
	}
	// Unordered output:
	// published: 3 error: <nil>
	// orders order-1
	// orders order-1
	// orders order-2
}

// The worker runs in the background until Stop, which finishes in-flight batches and
// hands the buckets back to the other relays.
func ExampleRelay_Start() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	broker := outboxtest.NewRecorder()

	d, _ := relay.New(store, broker, relay.Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err := d.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	_ = store.Enqueue(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("placed")})
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = broker.WaitFor(waitCtx, 1) // the commit wakes the worker up

	fmt.Println("stop:", d.Stop(ctx))
	fmt.Println("delivered:", broker.Len())
	// Output:
	// stop: <nil>
	// delivered: 1
}
