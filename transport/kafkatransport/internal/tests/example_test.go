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
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// Example runs package kafka's Example (which needs a broker, so it is only compiled
// there) against an in-process Kafka cluster and checks what it prints. Keep the two
// in step.
func Example() {
	// An in-process cluster stands in for real brokers.
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	// kgo's defaults (acks from all in-sync replicas, idempotent writes) are what the
	// transport needs; the partitioner also honours explicit partitions.
	producer, err := kgo.NewClient(
		kgo.SeedBrokers(cluster.ListenAddrs()...),
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
		kgo.SeedBrokers(cluster.ListenAddrs()...),
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
	// Output:
	// orders key=order-1 payload="{\"status\":\"placed\"}" tombstone=false id-matches=true headers=3
	// orders key=order-1 payload="" tombstone=true id-matches=true headers=2
}
