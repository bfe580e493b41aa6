package outbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/memstore"
)

// Messages with one key always land in one bucket: the bucket Kafka's default
// partitioner would pick among as many partitions.
func ExampleBucketOf() {
	msg := outbox.Message{Topic: "orders", Key: []byte("customer-7")}
	fmt.Println(outbox.BucketOf(&msg, uuid.Nil, 8), outbox.BucketOf(&msg, uuid.Nil, 16))
	// Output: 7 7
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

	pending, _ := store.Fetch(ctx, 0, 10)
	fmt.Println(len(pending), string(pending[0].Key))
	// Output:
	// <nil>
	// card declined
	// true
	// 1 order-1
}

// An application that runs its own transaction stages sends on a scope and writes
// them with the store's EnqueueTx-style call inside that transaction.
func ExampleNewScope() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	_ = sender.Send(ctx, outbox.Message{Topic: "orders", Payload: []byte("placed")})

	staged := scope.Take() // inside the application's transaction
	fmt.Println(len(staged), staged[0].Topic, scope.Len())
	// Output: 1 orders 0
}
