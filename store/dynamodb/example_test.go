package dynamodb_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	dynamodb "github.com/outboxkit/outbox/store/dynamodb"
)

// An order and the message announcing it are written in one TransactWriteItems
// request: the unit of work takes the envelope staged on the request's scope.
func Example() {
	ctx := context.Background()
	// A DynamoDB API server in the process; point the client at DynamoDB in production.
	srv := httptest.NewServer(server.NewServer())
	defer srv.Close()
	client := ddb.New(ddb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("local", "local", ""),
	})

	opts := dynamodb.Options{TableName: "orders-outbox"}
	if err := dynamodb.CreateIfNotExists(ctx, client, opts); err != nil {
		panic(err)
	}
	store, err := dynamodb.New(client, opts)
	if err != nil {
		panic(err)
	}
	defer store.Close()

	// A request handler: capture stages the envelope on the scope (the middleware
	// does this in Transactional mode), then the handler commits.
	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	env, err := outbox.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte("order-42"), Payload: []byte(`{"id":42}`)}, store.BucketCount())
	if err != nil {
		panic(err)
	}
	if err := scope.Stage(env); err != nil {
		panic(err)
	}
	order := types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String("orders-outbox"),
		Item: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: "ORDER#42"},
			"SK": &types.AttributeValueMemberS{Value: "ORDER"},
		},
		ConditionExpression: aws.String("attribute_not_exists(PK)"),
	}}
	if err := store.Commit(ctx, order); err != nil {
		panic(err)
	}

	// A relay reads the bucket in sequence order and deletes what it published.
	batch, err := store.Fetch(ctx, env.Bucket, 10)
	if err != nil {
		panic(err)
	}
	for _, e := range batch {
		fmt.Printf("seq %d: %s %s %s\n", e.Seq, e.Topic, e.Key, e.Payload)
	}
	if err := store.Complete(ctx, batch); err != nil {
		panic(err)
	}
	left, _ := store.Fetch(ctx, env.Bucket, 10)
	fmt.Println("left:", len(left))

	// Output:
	// seq 1: orders order-42 {"id":42}
	// left: 0
}
