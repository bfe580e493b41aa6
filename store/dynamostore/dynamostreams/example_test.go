package dynamostreams_test

import (
	"log"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/dynamostore/dynamostreams"
)

// The main function of the Lambda function mapped to the outbox table's stream
// (StreamViewType KEYS_ONLY, FunctionResponseTypes ReportBatchItemFailures). Build
// everything once per execution environment; each environment is one relay, so its
// RelayID must be its own: the log stream name is. A scheduled function built the
// same way calls disp.RunOnce as the safety net. The runnable version of this
// example is in the package's internal tests.
func Example() {
	client := ddb.New(ddb.Options{Region: "eu-west-1"}) // dynamodb.NewFromConfig(cfg) in a real function
	store, err := dynamostore.New(client, dynamostore.Config{TableName: "orders-outbox"})
	if err != nil {
		log.Fatal(err)
	}
	var transport driver.Transport = outboxtest.NewRecorder() // the broker's transport, e.g. SQS
	disp, err := relay.New(store, transport, relay.Config{RelayID: os.Getenv("AWS_LAMBDA_LOG_STREAM_NAME")})
	if err != nil {
		log.Fatal(err)
	}
	h, err := dynamostreams.New(disp, store.Driver(), dynamostreams.Config{})
	if err != nil {
		log.Fatal(err)
	}
	lambda.Start(h.Handle)
}
