package memstore_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/memstore"
)

// A handler's unit of work on the memory store behaves as on a database: the sends of
// a failed unit are not written. OnCommit makes a test double of the application's
// repository commit with them.
func ExampleStore_Transact() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{BucketCount: 1})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})
	orders := map[string]bool{} // the application's state in this test

	place := func(id string, fail bool) error {
		return store.Transact(ctx, func(ctx context.Context) error {
			if err := memstore.OnCommit(ctx, func() error { orders[id] = true; return nil }); err != nil {
				return err
			}
			if err := sender.Send(ctx, outbox.Message{Topic: "order-placed", Key: []byte(id)}); err != nil {
				return err
			}
			if fail {
				return errors.New("card declined")
			}
			return nil
		})
	}
	fmt.Println(place("order-1", false))
	fmt.Println(place("order-2", true))

	pending, _ := store.Driver().Fetch(ctx, 0, 10) // what a relay would publish
	fmt.Println(len(pending.Envelopes), string(pending.Envelopes[0].Key), orders)
	// Output:
	// <nil>
	// card declined
	// 1 order-1 map[order-1:true]
}
