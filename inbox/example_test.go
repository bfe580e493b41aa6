package inbox_test

import (
	"context"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
)

// A consumer applies each message once: the second delivery of a message is a
// duplicate, its function does not run, and the receipt it sends is sent once.
func ExampleInbox_Process() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{BucketCount: 1})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Transactional})
	in, _ := inbox.New(store, inbox.Config{Consumer: "billing"})

	balance := 0
	received := &outbox.Message{
		Topic:   "payments",
		Payload: []byte("40"),
		Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("payment-1")}},
	}
	for range 2 { // the broker delivers it twice
		res, err := in.Process(ctx, received, func(ctx context.Context) error {
			// The state change commits with the key and the receipt.
			if err := memstore.OnCommit(ctx, func() error { balance += 40; return nil }); err != nil {
				return err
			}
			return sender.Send(ctx, outbox.Message{Topic: "receipts", Payload: []byte("payment-1")})
		})
		fmt.Println(res.Key, "duplicate:", res.Duplicate, "error:", err)
	}
	receipts, _ := store.Driver().Fetch(ctx, 0, 10)
	fmt.Println("balance:", balance, "receipts:", len(receipts))
	// Output:
	// payment-1 duplicate: false error: <nil>
	// payment-1 duplicate: true error: <nil>
	// balance: 40 receipts: 1
}
