package tests

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// The transport appends to a stream named after the topic; a consumer group reads
// the entry back with Decode. It needs a Redis server (OUTBOX_TEST_REDIS_ADDR,
// default 127.0.0.1:6379).
func Example() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: cmp.Or(os.Getenv("OUTBOX_TEST_REDIS_ADDR"), "127.0.0.1:6379")})
	defer client.Close()
	prefix := "outbox-example-" + uuid.NewString()[:8] + ":"
	stream := prefix + "order-placed"
	defer client.Del(ctx, stream)

	transport, err := redistransport.New(client, redistransport.Config{
		Stream: func(topic string) string { return prefix + topic },
	})
	if err != nil {
		log.Fatal(err)
	}
	// The consumer group, created before anything is appended, reads from the start.
	if err := client.XGroupCreateMkStream(ctx, stream, "billing", "0").Err(); err != nil {
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
	if err := transport.Publish(ctx, []*driver.Envelope{env}); err != nil {
		log.Fatal(err)
	}

	streams, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "billing", Consumer: "billing-1", Streams: []string{stream, ">"}, Count: 10,
	}).Result()
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range streams {
		for _, entry := range s.Messages {
			d, err := redistransport.Decode(s.Stream, entry)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Printf("%s key=%s payload=%s\n", d.Topic, d.Key, d.Payload)
			fmt.Println("same id:", d.ID == env.ID)
			correlation, _ := d.Header(outbox.HeaderCorrelationID)
			fmt.Println("correlation:", string(correlation))
			client.XAck(ctx, s.Stream, "billing", entry.ID)
		}
	}
	// Output:
	// order-placed key=order-7 payload={"id":"order-7"}
	// same id: true
	// correlation: req-1
}
