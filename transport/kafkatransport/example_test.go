package kafkatransport_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// Example publishes two envelopes to the topic "orders" and reads them back with
// Decode. It needs a broker, so go test compiles it without running it; against a
// broker whose "orders" topic is empty, it prints:
//
//	orders key=order-1 payload="{\"status\":\"placed\"}" tombstone=false id-matches=true headers=3
//	orders key=order-1 payload="" tombstone=true id-matches=true headers=2
func Example() {
	brokers := []string{"localhost:9092"}

	// kgo's defaults (acks from all in-sync replicas, idempotent writes) are what the
	// transport needs; the partitioner also honours explicit partitions.
	producer, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.RecordPartitioner(kafkatransport.Partitioner(nil)),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	transport, err := kafkatransport.New(producer, kafkatransport.Config{})
	if err != nil {
		log.Fatal(err)
	}

	// The dispatcher normally builds these batches from the store.
	var batch []*driver.Envelope
	for _, m := range []outbox.Message{
		{Topic: "orders", Key: []byte("order-1"), Payload: []byte(`{"status":"placed"}`),
			Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}}},
		{Topic: "orders", Key: []byte("order-1"), Payload: nil}, // a tombstone
	} {
		env, err := driver.NewEnvelope(m, driver.DefaultBucketCount)
		if err != nil {
			log.Fatal(err)
		}
		batch = append(batch, env)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := transport.Publish(ctx, batch); err != nil {
		log.Fatal(err)
	}

	consumer, err := kgo.NewClient(
		kgo.SeedBrokers(brokers...),
		kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	for read := 0; read < len(batch); {
		fetches := consumer.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			log.Fatal(err)
		}
		for _, rec := range fetches.Records() {
			d, err := kafkatransport.Decode(rec)
			if err != nil {
				log.Fatal(err)
			}
			idKey, _ := d.Header(outbox.HeaderIdempotencyKey)
			fmt.Printf("%s key=%s payload=%q tombstone=%v id-matches=%v headers=%d\n",
				d.Topic, d.Key, d.Payload, d.Payload == nil,
				d.ID == batch[read].ID && string(idKey) == d.ID.String(), len(d.Headers))
			read++
		}
	}
}

// Capture learns the transport's size limit when the transport is wired into
// outbox.NewSender: a message the transport could never publish is refused at Send,
// before anything is written, instead of being parked by the relay later.
func ExampleTransport_MaxMessageSize() {
	// kgo.NewClient never dials until the client is used; a real program also passes
	// kgo.SeedBrokers.
	client, err := kgo.NewClient()
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	transport, err := kafkatransport.New(client, kafkatransport.Config{MaxMessageSize: 64 << 10})
	if err != nil {
		log.Fatal(err)
	}
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
	if err != nil {
		log.Fatal(err)
	}

	ctx := context.Background()
	for _, size := range []int{1 << 10, 100 << 10} {
		err := store.Transact(ctx, func(ctx context.Context) error {
			return sender.Send(ctx, outbox.Message{Topic: "orders", Payload: make([]byte, size)})
		})
		fmt.Printf("%d KiB: too large: %v\n", size>>10, errors.Is(err, outbox.ErrTooLarge))
	}
	fmt.Println("transport's limit:", transport.MaxMessageSize())
	// Output:
	// 1 KiB: too large: false
	// 100 KiB: too large: true
	// transport's limit: 65536
}
