package dynamostore_test

// These examples need DynamoDB, so they are compiled but not run; their runnable
// versions, against a DynamoDB API server in the process, are in the module's
// internal tests package. The tests of package dynamostore need no module the package
// itself does not: an application's go mod tidy loads them too.

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// awsConfig stands for the application's AWS configuration, which it loads with
// config.LoadDefaultConfig (package github.com/aws/aws-sdk-go-v2/config).
var awsConfig aws.Config

// An order and the message announcing it are written in one TransactWriteItems
// request: AddItems adds the order to the unit of work, the send joins it. It needs
// DynamoDB, so go test compiles it without running it; on a new table, it prints:
//
//	seq 1: orders order-42 {"id":42}
func Example() {
	ctx := context.Background()
	client := dynamodb.NewFromConfig(awsConfig)

	cfg := dynamostore.Config{TableName: "orders-outbox"}
	if err := dynamostore.CreateIfNotExists(ctx, client, cfg); err != nil {
		panic(err)
	}
	store, err := dynamostore.New(client, cfg)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	if err != nil {
		panic(err)
	}

	// A request handler.
	err = store.Transact(ctx, func(ctx context.Context) error {
		order := types.TransactWriteItem{Put: &types.Put{
			TableName: aws.String("orders-outbox"),
			Item: map[string]types.AttributeValue{
				"PK": &types.AttributeValueMemberS{Value: "ORDER#42"},
				"SK": &types.AttributeValueMemberS{Value: "ORDER"},
			},
			ConditionExpression: aws.String("attribute_not_exists(PK)"),
		}}
		if err := dynamostore.AddItems(ctx, order); err != nil {
			return err
		}
		return sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-42"), Payload: []byte(`{"id":42}`)})
	})
	if err != nil {
		panic(err)
	}

	// A relay (package relay) reads each bucket in sequence order through the
	// store's relay side, and deletes what it published.
	rs := store.Driver()
	for bucket := range rs.BucketCount() {
		batch, err := rs.Fetch(ctx, bucket, 10)
		if err != nil {
			panic(err)
		}
		for _, e := range batch.Envelopes {
			fmt.Printf("seq %d: %s %s %s\n", e.Seq, e.Topic, e.Key, e.Payload)
		}
		if err := rs.Complete(ctx, batch.Envelopes); err != nil {
			panic(err)
		}
	}
}

// An application that builds its own TransactWriteItems request sends on a scope
// and appends the items CreateTransactWriteItems makes of the staged messages to its
// request. It needs DynamoDB, so go test compiles it without running it; on a new
// table, it prints:
//
//	seq 1: orders order-7 {"id":7}
func ExampleStore_CreateTransactWriteItems() {
	ctx := context.Background()
	client := dynamodb.NewFromConfig(awsConfig)

	cfg := dynamostore.Config{TableName: "orders-outbox"}
	if err := dynamostore.CreateIfNotExists(ctx, client, cfg); err != nil {
		panic(err)
	}
	store, err := dynamostore.New(client, cfg)
	if err != nil {
		panic(err)
	}
	defer store.Close()
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	if err != nil {
		panic(err)
	}

	// One attempt of the application's write; a retry runs all of it again.
	sctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	if err := sender.Send(sctx, outbox.Message{Topic: "orders", Key: []byte("order-7"), Payload: []byte(`{"id":7}`)}); err != nil {
		panic(err)
	}
	items, err := store.CreateTransactWriteItems(sctx) // takes the scope's messages
	if err != nil {
		panic(err)
	}
	order := types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String("orders-outbox"),
		Item: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: "ORDER#7"},
			"SK": &types.AttributeValueMemberS{Value: "ORDER"},
		},
	}}
	_, err = client.TransactWriteItems(ctx, &dynamodb.TransactWriteItemsInput{
		TransactItems: append([]types.TransactWriteItem{order}, items...),
	})
	if err != nil {
		panic(err)
	}
	store.NotifyCommitted(items...)

	// What a relay reads: the message is in its bucket.
	rs := store.Driver()
	for bucket := range rs.BucketCount() {
		batch, err := rs.Fetch(ctx, bucket, 10)
		if err != nil {
			panic(err)
		}
		for _, e := range batch.Envelopes {
			fmt.Printf("seq %d: %s %s %s\n", e.Seq, e.Topic, e.Key, e.Payload)
		}
	}
}
