package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// publish relays what the store holds once and prints what reached the broker.
func publish(ctx context.Context, store *memstore.Store) {
	broker := outboxtest.NewRecorder()
	r, _ := relay.New(store, broker, relay.Config{})
	_, _ = r.RunOnce(ctx)
	for _, m := range broker.Messages() {
		fmt.Println("published:", m.Topic, string(m.Key))
	}
}

// A send joins the unit of work whose ctx it is made with: it is written when the
// function returns nil, and not at all when it fails.
func ExampleNewSender() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{BucketCount: 1})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	placeOrder := func(id string, declined bool) error {
		return store.Transact(ctx, func(ctx context.Context) error {
			// ... the order row is written here, through the store's transaction ...
			if err := sender.Send(ctx, outbox.Message{Topic: "order-placed", Key: []byte(id)}); err != nil {
				return err
			}
			if declined {
				return errors.New("card declined")
			}
			return nil
		})
	}
	fmt.Println(placeOrder("order-1", false))
	fmt.Println(placeOrder("order-2", true))
	fmt.Println(errors.Is(sender.Send(ctx, outbox.Message{Topic: "order-placed"}), outbox.ErrNoTransaction))
	publish(ctx, store)
	// Output:
	// <nil>
	// card declined
	// true
	// published: order-placed order-1
}

// A Transact inside another is a savepoint: when it fails, its writes and its sends
// are undone and the outer unit goes on.
func ExampleTransactor_nested() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{BucketCount: 1})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	err := store.Transact(ctx, func(ctx context.Context) error {
		if err := sender.Send(ctx, outbox.Message{Topic: "order-placed", Key: []byte("o-1")}); err != nil {
			return err
		}
		err := store.Transact(ctx, func(ctx context.Context) error {
			_ = sender.Send(ctx, outbox.Message{Topic: "points-added", Key: []byte("o-1")})
			return errors.New("loyalty service down")
		})
		fmt.Println("points skipped:", err)
		return nil
	})
	fmt.Println(err)
	publish(ctx, store)
	// Output:
	// points skipped: loyalty service down
	// <nil>
	// published: order-placed o-1
}

// A message may carry its ID: the relay publishes it under that ID, which the
// transports put in the outbox.HeaderMessageID header.
func ExampleMessage_id() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate})

	id := uuid.MustParse("0190f2a1-7c1e-7000-8000-000000000001") // an event id of the application's
	_ = sender.Send(ctx, outbox.Message{ID: id, Topic: "order-placed"})

	broker := outboxtest.NewRecorder()
	r, _ := relay.New(store, broker, relay.Config{})
	_, _ = r.RunOnce(ctx)
	fmt.Println(broker.Messages()[0].ID)
	// Output: 0190f2a1-7c1e-7000-8000-000000000001
}

// An application that runs its own transaction stages sends on a scope; the store's
// write call for that transaction (sqlstore's EnqueueTx, say) takes them. What no
// transaction took is discarded, and reported, at Release.
func ExampleNewScope() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	ctx, scope := outbox.NewScope(ctx)
	_ = sender.Send(ctx, outbox.Message{Topic: "orders", Payload: []byte("placed")})
	fmt.Println(scope.Len())
	fmt.Println(scope.Release()) // no transaction took it
	// Output:
	// 1
	// 1
}
