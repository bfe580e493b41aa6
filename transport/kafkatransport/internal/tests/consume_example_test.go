package tests

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// Example_consumer runs package kafkatransport's ExampleNewSource against an in-process
// cluster: a payment published twice (as a relay that crashed after the broker's
// acknowledgement would) is applied once, and its receipt sent once.
func Example_consumer() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "payments"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	transport, err := kafkatransport.New(producer, kafkatransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	env, err := driver.NewEnvelope(outbox.Message{Topic: "payments", Key: []byte("acct-7"), Payload: []byte("40")}, driver.DefaultBucketCount)
	if err != nil {
		log.Fatal(err)
	}
	for range 2 { // published twice: the same envelope, so the same message id
		if err := transport.Publish(context.Background(), []*driver.Envelope{env}); err != nil {
			log.Fatal(err)
		}
	}

	store, _ := memstore.New(memstore.Config{BucketCount: 1})
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Transactional})
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	client, err := kgo.NewClient(
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumerGroup("billing"), kgo.ConsumeTopics("payments"),
		kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src, err := kafkatransport.NewSource(client, kafkatransport.SourceConfig{})
	if err != nil {
		log.Fatal(err)
	}
	consumer, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		return sender.Send(ctx, outbox.Message{Topic: "receipts", Key: d.Key, Payload: d.Payload})
	}, inbox.ConsumerConfig{Processed: func(d *inbox.Delivery, res inbox.Result) {
		offset := d.Raw.(*kgo.Record).Offset
		fmt.Printf("offset %d duplicate %t\n", offset, res.Duplicate)
		if offset == 1 {
			cancel() // both records seen: stop
		}
	}})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Run(ctx); err != nil {
		log.Fatal(err)
	}
	receipts, _ := store.Driver().Fetch(context.Background(), 0, 10)
	fmt.Println("receipts:", len(receipts.Envelopes))
	// Output:
	// offset 0 duplicate false
	// offset 1 duplicate true
	// receipts: 1
}
