package chaostest

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/chaos"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// dynamoClient starts an in-process DynamoDB API server and returns an SDK client
// for it.
func dynamoClient(t *testing.T) *ddb.Client {
	t.Helper()
	srv := httptest.NewServer(server.NewServer())
	t.Cleanup(srv.Close)
	return ddb.New(ddb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
	})
}

// dynamoConfig scales the run down: the in-process DynamoDB server is far slower than
// the real service (tens of milliseconds per transaction under the race detector), so
// the same message count would take minutes to write.
func dynamoConfig() chaos.Config {
	cfg := chaosConfig()
	if large() {
		cfg.Messages = 10_000
	} else {
		cfg.Messages = 600
	}
	cfg.LeaseDuration = 3 * time.Second
	cfg.DrainTimeout = 3 * time.Minute
	return cfg
}

func TestChaosDynamoDB(t *testing.T) {
	cfg := dynamoConfig()
	cfg.Reopen = func(t *testing.T, s outboxtest.Store) outboxtest.Store {
		st := s.(*dynamostore.Store)
		var client *ddb.Client
		require.True(t, st.As(&client))
		other, err := dynamostore.New(client, st.Config())
		require.NoError(t, err)
		return other
	}
	rep := chaos.Run(t, outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outboxtest.Store {
			client := dynamoClient(t)
			cfg := dynamostore.Config{TableName: "outbox", BucketCount: bucketCount}
			// The table exists before any concurrent work starts.
			require.NoError(t, dynamostore.CreateIfNotExists(context.Background(), client, cfg))
			s, err := dynamostore.New(client, cfg)
			require.NoError(t, err)
			return s
		},
		// No Transact: the writers use the store's own unit of work.
	}, cfg)
	verify(t, rep, cfg)
}
