package sqstransport_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// Decode reads back what the transport published: here a message as a consumer
// receives it (with MessageAttributeNames ["All"]), whose binary payload travelled as
// base64 and whose headers travelled as attributes.
func ExampleDecode() {
	received := types.Message{
		Body: aws.String("AAH/"),
		MessageAttributes: map[string]types.MessageAttributeValue{
			"x-outbox-message-id": {DataType: aws.String("String"), StringValue: aws.String("0192f3a4-5b6c-7d8e-9f01-23456789abcd")},
			"x-outbox-key":        {DataType: aws.String("String"), StringValue: aws.String("order-7")},
			"x-outbox-layout":     {DataType: aws.String("String"), StringValue: aws.String("body=base64")},
			"idempotency-key":     {DataType: aws.String("String"), StringValue: aws.String("charge-7")},
		},
	}
	d, err := sqstransport.Decode(received)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("id:", d.ID)
	fmt.Printf("key: %s\n", d.Key)
	fmt.Printf("payload: % x\n", d.Payload)
	for _, h := range d.Headers {
		fmt.Printf("header %s: %s\n", h.Key, h.Value)
	}
	// Output:
	// id: 0192f3a4-5b6c-7d8e-9f01-23456789abcd
	// key: order-7
	// payload: 00 01 ff
	// header idempotency-key: charge-7
	// header x-outbox-message-id: 0192f3a4-5b6c-7d8e-9f01-23456789abcd
}

// A relay publishing to SQS: the client is built by the caller (region, credentials,
// endpoint); topics are queue names, looked up once each. The writers' capture gets
// the same transport, so it refuses what SQS could never carry. This example needs
// AWS (or an emulator through AWS_ENDPOINT_URL_SQS), so it is compiled but not run.
func Example_relay() {
	ctx := context.Background()
	// In a real program: awsCfg, err := config.LoadDefaultConfig(ctx), from the
	// aws-sdk-go-v2/config module.
	awsCfg := aws.Config{Region: "eu-west-1"}
	transport, err := sqstransport.New(sqs.NewFromConfig(awsCfg), sqstransport.Config{
		QueueLimit: sqstransport.MaxQueueLimit, // the queues allow 1 MiB
	})
	if err != nil {
		log.Fatal(err)
	}
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := relay.New(store, transport, relay.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer relay.Stop(ctx)

	err = store.Transact(ctx, func(ctx context.Context) error {
		// ... the application's writes in the same transaction ...
		return sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-7"), Payload: []byte(`{"status":"placed"}`)})
	})
	if err != nil {
		log.Fatal(err)
	}
}

// Capture learns the transport's size limit when the transport is wired into
// outbox.NewSender: a message SQS could never carry is refused at Send, before
// anything is written, instead of being parked by the relay later. The limit is on
// the message as captured; it leaves room for base64 and the attributes the
// transport adds, within Config.QueueLimit.
func ExampleTransport_MaxMessageSize() {
	// New never dials; a real client comes from sqs.NewFromConfig.
	transport, err := sqstransport.New(sqs.New(sqs.Options{Region: "eu-west-1"}), sqstransport.Config{})
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
	for _, size := range []int{100 << 10, 500 << 10} {
		err := store.Transact(ctx, func(ctx context.Context) error {
			return sender.Send(ctx, outbox.Message{Topic: "orders", Payload: make([]byte, size)})
		})
		fmt.Printf("%d KiB: too large: %v\n", size>>10, errors.Is(err, outbox.ErrTooLarge))
	}
	fmt.Println("capture's limit:", transport.MaxMessageSize(), "of", sqstransport.DefaultQueueLimit)
	// Output:
	// 100 KiB: too large: false
	// 500 KiB: too large: true
	// capture's limit: 194698 of 262144
}
