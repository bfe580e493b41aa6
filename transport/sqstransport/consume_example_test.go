package sqstransport_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// A consumer service applies each payment once: the handler's writes, the inbox key
// and the receipt it sends commit together, and the SQS message is deleted after
// them. (It needs a queue, so it is only compiled; TestConsumerAppliesOnceInGroupOrderAndDeletesAfterCommit
// runs the same loop against the emulator.)
func ExampleNewSource() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	store, _ := memstore.New(memstore.Config{}) // dynamostore or sqlstore in production
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Transactional})
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	var client *sqs.Client // sqs.NewFromConfig(cfg), built by the application
	src, err := sqstransport.NewSource(client, sqstransport.SourceConfig{QueueURL: os.Getenv("PAYMENTS_QUEUE_URL")})
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
