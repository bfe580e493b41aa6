package chaostest

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/chaos"
	dynamodb "github.com/outboxkit/outbox/store/dynamodb"
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
	cfg.Reopen = func(t *testing.T, s outbox.DispatchStore) outbox.DispatchStore {
		st := s.(*dynamodb.Store)
		var client *ddb.Client
		require.True(t, st.As(&client))
		other, err := dynamodb.New(client, st.Options())
		require.NoError(t, err)
		return other
	}
	rep := chaos.Run(t, outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outbox.DispatchStore {
			client := dynamoClient(t)
			opts := dynamodb.Options{TableName: "outbox", BucketCount: bucketCount}
			// The table exists before any concurrent work starts.
			require.NoError(t, dynamodb.CreateIfNotExists(context.Background(), client, opts))
			s, err := dynamodb.New(client, opts)
			require.NoError(t, err)
			return s
		},
		Transact: func(ctx context.Context, s outbox.DispatchStore, fn func(ctx context.Context) error) error {
			return s.(*dynamodb.Store).Transact(ctx, func(ctx context.Context) ([]types.TransactWriteItem, error) {
				return nil, fn(ctx)
			})
		},
	}, cfg)
	verify(t, rep, cfg)
}

// TestDynamoDBUnitOfWorkOverItsLimits: a unit of work beyond one TransactWriteItems
// request (100 items) or with nothing in it is refused with a clear error before
// anything is sent, and nothing is written.
func TestDynamoDBUnitOfWorkOverItsLimits(t *testing.T) {
	ctx := context.Background()
	client := dynamoClient(t)
	opts := dynamodb.Options{TableName: "outbox", BucketCount: 4}
	require.NoError(t, dynamodb.CreateIfNotExists(ctx, client, opts))
	s, err := dynamodb.New(client, opts)
	require.NoError(t, err)
	defer func() { _ = s.Close() }()

	stage := func(n int) context.Context {
		uctx, scope := outbox.NewScope(ctx)
		t.Cleanup(func() { scope.Release() })
		for i := range n {
			env, err := outbox.NewEnvelope(outbox.Message{Topic: "t", Key: []byte{byte(i)}, Payload: []byte("p")}, 4)
			require.NoError(t, err)
			require.NoError(t, scope.Stage(env))
		}
		return uctx
	}
	app := types.TransactWriteItem{Put: &types.Put{TableName: aws.String("outbox"), Item: map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "APP#1"}, "SK": &types.AttributeValueMemberS{Value: "state"},
	}}}

	err = s.Commit(stage(dynamodb.MaxEnqueue), app)
	require.ErrorIs(t, err, outbox.ErrTooLarge, "100 envelopes and an application item exceed one request")
	require.Contains(t, err.Error(), "100")
	err = s.Commit(stage(dynamodb.MaxEnqueue + 1))
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	require.ErrorIs(t, s.Commit(stage(0)), dynamodb.ErrNothingToCommit)
	require.Zero(t, pendingCount(t, s), "a refused unit of work writes nothing")
	out, err := client.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String("outbox"), Key: app.Put.Item})
	require.NoError(t, err)
	require.Empty(t, out.Item, "the application's item is not written either")

	// At the limit it commits.
	require.NoError(t, s.Commit(stage(dynamodb.MaxEnqueue-1), app))
	require.Equal(t, dynamodb.MaxEnqueue-1, pendingCount(t, s))
}
