package redistransport_test

import (
	"context"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// The relay's transport on a client the application made. The runnable version, with
// a server, is in internal/tests.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	transport, err := redistransport.New(client, redistransport.Config{
		Stream: func(topic string) string { return "events:" + topic },
		MaxLen: 1_000_000, // about a million entries per stream; older ones are trimmed
	})
	if err != nil {
		log.Fatal(err)
	}
	env, err := driver.NewEnvelope(outbox.Message{Topic: "order-placed", Key: []byte("order-7"), Payload: []byte(`{"id":"order-7"}`)}, driver.DefaultBucketCount)
	if err != nil {
		log.Fatal(err)
	}
	if err := transport.Publish(context.Background(), []*driver.Envelope{env}); err != nil {
		log.Fatal(err)
	}
}

// A consumer in a group reads what the relay appended and deduplicates on the
// message id.
func ExampleDecode() {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	streams, err := client.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: "billing", Consumer: "billing-1", Streams: []string{"events:order-placed", ">"}, Count: 100,
	}).Result()
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range streams {
		for _, entry := range s.Messages {
			d, err := redistransport.Decode(s.Stream, entry)
			if err != nil {
				log.Fatal(err) // not an outbox entry
			}
			log.Printf("%s: key %s, payload %s (message %s)", d.Topic, d.Key, d.Payload, d.ID)
			client.XAck(ctx, s.Stream, "billing", entry.ID)
		}
	}
}
