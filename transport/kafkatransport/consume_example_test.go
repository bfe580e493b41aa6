package kafkatransport_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// A consumer service applies each payment once: the handler's writes, the inbox key
// and the receipt it sends commit together, and the record's offset is committed
// after them. (It needs a broker, so it is only compiled; its runnable twin is in
// internal/tests.)
func ExampleNewSource() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	store, _ := memstore.New(memstore.Config{}) // sqlstore or dynamostore in production
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Transactional})
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	client, err := kgo.NewClient(
		kgo.SeedBrokers("localhost:9092"),
		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("payments"),
		kgo.DisableAutoCommit(), // the consumer commits after each unit of work
	)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	src, err := kafkatransport.NewSource(client, kafkatransport.SourceConfig{})
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		// Write the payment through the store's accessor with ctx, then:
		return sender.Send(ctx, outbox.Message{Topic: "receipts", Key: d.Key, Payload: d.Payload})
	}, inbox.ConsumerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Run(ctx); err != nil { // returns after a graceful stop on SIGTERM
		log.Fatal(err)
	}
}
