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
	fmt.Println("balance:", balance, "receipts:", len(receipts.Envelopes))
	// Output:
	// payment-1 duplicate: false error: <nil>
	// payment-1 duplicate: true error: <nil>
	// balance: 40 receipts: 1
}

// sliceSource is a broker of the example's own: it hands out its deliveries one at a
// time and, once they are all out, stops the consumer.
type sliceSource struct {
	deliveries []*inbox.Delivery
	acked      int
	stop       context.CancelFunc
}

func (s *sliceSource) Receive(ctx context.Context) ([][]*inbox.Delivery, error) {
	if len(s.deliveries) == 0 {
		s.stop()
		return nil, nil
	}
	d := s.deliveries[0]
	s.deliveries = s.deliveries[1:]
	return [][]*inbox.Delivery{{d}}, nil
}

func (s *sliceSource) Ack(_ context.Context, ds []*inbox.Delivery) error {
	s.acked += len(ds)
	return nil
}

func (s *sliceSource) Reject(context.Context, *inbox.Delivery, error) error { return nil }

// A consumer receives from a broker's Source (kafkatransport.NewSource and the like
// in an application) and applies each delivery once: the broker delivers a payment
// twice, the second is a duplicate, and both are acknowledged after their units.
func ExampleConsumer() {
	store, _ := memstore.New(memstore.Config{BucketCount: 1})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Transactional})
	in, _ := inbox.New(store, inbox.Config{Consumer: "billing"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	payment := outbox.Message{
		Topic:   "payments",
		Payload: []byte("40"),
		Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("payment-1")}},
	}
	src := &sliceSource{deliveries: []*inbox.Delivery{{Message: payment}, {Message: payment, Redelivered: true}}, stop: cancel}
	consumer, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		return sender.Send(ctx, outbox.Message{Topic: "receipts", Payload: d.Payload})
	}, inbox.ConsumerConfig{Processed: func(d *inbox.Delivery, res inbox.Result) {
		fmt.Println(res.Key, "redelivered:", d.Redelivered, "duplicate:", res.Duplicate)
	}})
	if err != nil {
		panic(err)
	}
	if err := consumer.Run(ctx); err != nil {
		panic(err)
	}
	receipts, _ := store.Driver().Fetch(context.Background(), 0, 10)
	fmt.Println("acknowledged:", src.acked, "receipts:", len(receipts.Envelopes))
	// Output:
	// payment-1 redelivered: false duplicate: false
	// payment-1 redelivered: true duplicate: true
	// acknowledged: 2 receipts: 1
}
