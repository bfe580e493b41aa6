package watermilltransport_test

import (
	"context"
	"fmt"
	"log"

	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// Example relays a message through Watermill's in-process pub/sub and reads it back
// with Decode. Any other Watermill publisher (AMQP, Kafka, NATS, ...) takes the
// pub/sub's place.
func Example() {
	ctx := context.Background()
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, nil)
	defer pubSub.Close()

	transport, err := watermilltransport.New(pubSub, watermilltransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport, Mode: outbox.Immediate})
	if err != nil {
		log.Fatal(err)
	}
	err = sender.Send(ctx, outbox.Message{
		Topic: "orders", Key: []byte("order-1"), Payload: []byte(`{"status":"placed"}`),
		Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}},
	})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := relay.New(store, transport, relay.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.RunOnce(ctx); err != nil {
		log.Fatal(err)
	}

	messages, err := pubSub.Subscribe(ctx, "orders")
	if err != nil {
		log.Fatal(err)
	}
	msg := <-messages
	msg.Ack()
	got, err := watermilltransport.Decode(msg)
	if err != nil {
		log.Fatal(err)
	}
	ct, _ := got.Header("content-type")
	fmt.Printf("%s key=%s payload=%s content-type=%s uuid-is-id=%t\n", got.Topic, got.Key, got.Payload, ct, msg.UUID == got.ID.String())
	// Output:
	// orders key=order-1 payload={"status":"placed"} content-type=application/json uuid-is-id=true
}
