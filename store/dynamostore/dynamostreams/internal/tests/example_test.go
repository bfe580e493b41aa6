package tests

import (
	"context"
	"fmt"
	"log"
	"net/http/httptest"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/dynamostore/dynamostreams"
)

// A stream invocation, against the in-process DynamoDB API server: a message is
// written, the stream's INSERT record for it is handed to the handler, and the
// message goes out.
func ExampleHandler_Handle() {
	srv := httptest.NewServer(server.NewServer())
	defer srv.Close()
	client := ddb.New(ddb.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("test", "test", "")})
	ctx := context.Background()
	cfg := dynamostore.Config{TableName: "orders-outbox", BucketCount: 4}
	if err := dynamostore.CreateIfNotExists(ctx, client, cfg); err != nil {
		log.Fatal(err)
	}
	store, err := dynamostore.New(client, cfg)
	if err != nil {
		log.Fatal(err)
	}
	env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte("order-7"), Payload: []byte("created")}, 4)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Driver().Enqueue(ctx, env); err != nil {
		log.Fatal(err)
	}

	rec := outboxtest.NewRecorder()
	disp, err := relay.New(store, rec, relay.Config{RelayID: "lambda-env-1", BacklogInterval: -1})
	if err != nil {
		log.Fatal(err)
	}
	h, err := dynamostreams.New(disp, store.Driver(), dynamostreams.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// What DynamoDB Streams delivers for the message's item (KEYS_ONLY).
	ev := events.DynamoDBEvent{Records: []events.DynamoDBEventRecord{{
		EventName: "INSERT",
		Change: events.DynamoDBStreamRecord{
			Keys: map[string]events.DynamoDBAttributeValue{
				"PK": events.NewStringAttribute(fmt.Sprintf("OUTBOX#MESSAGES#%d", env.Bucket)),
				"SK": events.NewStringAttribute(fmt.Sprintf("%019d", env.Seq)),
			},
			SequenceNumber: "100000000000000000001",
		},
	}}}
	resp, err := h.Handle(ctx, ev)
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range rec.Messages() {
		fmt.Printf("published %s %s\n", m.Key, m.Payload)
	}
	fmt.Println("failed records:", len(resp.BatchItemFailures))
	// Output:
	// published order-7 created
	// failed records: 0
}
