package tests

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// The transport publishes to a stream that captures the topic's subject; a consumer
// reads the message back with Decode. It needs a NATS server with JetStream
// (OUTBOX_TEST_NATS_URL, default nats://127.0.0.1:4222).
func Example() {
	ctx := context.Background()
	nc, err := nats.Connect(cmp.Or(os.Getenv("OUTBOX_TEST_NATS_URL"), nats.DefaultURL))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	name := streamName("example")
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       name,
		Subjects:   []string{name + ".>"},
		Storage:    jetstream.MemoryStorage,
		Duplicates: 10 * time.Minute, // the window in which a republished message is dropped
	})
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = js.DeleteStream(ctx, name) }()

	transport, err := natstransport.New(js, natstransport.Config{
		Subject: func(topic string) string { return name + "." + topic },
	})
	if err != nil {
		log.Fatal(err)
	}
	env, err := driver.NewEnvelope(outbox.Message{
		Topic:   "order-placed",
		Key:     []byte("order-7"),
		Payload: []byte(`{"id":"order-7"}`),
		Headers: []outbox.Header{{Key: outbox.HeaderCorrelationID, Value: []byte("req-1")}},
	}, driver.DefaultBucketCount)
	if err != nil {
		log.Fatal(err)
	}
	// Publishing twice, as a relay that crashed before forgetting the message would:
	// the stream keeps one copy.
	for range 2 {
		if err := transport.Publish(ctx, []*driver.Envelope{env}); err != nil {
			log.Fatal(err)
		}
	}

	consumer, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		log.Fatal(err)
	}
	batch, err := consumer.Fetch(10, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	for msg := range batch.Messages() {
		d, err := natstransport.Decode(msg)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s key=%s payload=%s\n", d.Topic, d.Key, d.Payload)
		fmt.Println("same id:", d.ID == env.ID, "sequence:", d.Sequence)
		correlation, _ := d.Header(outbox.HeaderCorrelationID)
		fmt.Println("correlation:", string(correlation))
		_ = msg.Ack()
	}
	// Output:
	// order-placed key=order-7 payload={"id":"order-7"}
	// same id: true sequence: 1
	// correlation: req-1
}
