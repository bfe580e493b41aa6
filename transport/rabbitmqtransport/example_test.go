package rabbitmqtransport_test

import (
	"context"
	"fmt"
	"log"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// Example wires the transport into a relay and reads a message back with Decode. It
// needs a broker, so go test compiles it without running it. The exchange "orders"
// and a queue bound to it are the application's to declare; against a broker with
// them, it prints:
//
//	orders key=order-1 payload={"status":"placed"} content-type=application/json
func Example() {
	url := "amqp://guest:guest@localhost:5672/"
	dial := func(ctx context.Context) (*amqp.Connection, error) {
		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	}
	transport, err := rabbitmqtransport.New(dial, rabbitmqtransport.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer transport.Close()

	store, err := memstore.New(memstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// Capture refuses at Send what the transport could never publish.
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport, Mode: outbox.Immediate})
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
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

	// A consumer: the queue "orders-audit" is bound to the exchange "orders" with the
	// routing key "order-1" (or to a fanout exchange).
	conn, err := dial(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	d, ok, err := ch.Get("orders-audit", true)
	if err != nil || !ok {
		log.Fatal("no message: ", err)
	}
	got, err := rabbitmqtransport.Decode(d)
	if err != nil {
		log.Fatal(err)
	}
	ct, _ := got.Header("content-type")
	fmt.Printf("%s key=%s payload=%s content-type=%s\n", got.Topic, got.Key, got.Payload, ct)
}
