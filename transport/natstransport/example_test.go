package natstransport_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// The relay's transport on a connection the application made; the stream that
// captures the topic's subject is the deployment's. The runnable version, with a
// server, is in internal/tests.
func Example() {
	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	transport, err := natstransport.New(js, natstransport.Config{
		Subject: func(topic string) string { return "events." + topic },
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

// A consumer reads what the relay published and deduplicates on the message id.
func ExampleDecode() {
	var msg jetstream.Msg // from a consumer's Fetch, Consume or Messages
	d, err := natstransport.Decode(msg)
	if err != nil {
		log.Fatal(err) // not an outbox message
	}
	log.Printf("%s: key %s, payload %s (message %s, stream sequence %d)", d.Topic, d.Key, d.Payload, d.ID, d.Sequence)
}
