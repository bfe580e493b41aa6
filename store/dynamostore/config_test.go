package dynamostore_test

import (
	"strings"
	"testing"

	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/dynamostore"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		opts  dynamostore.Config
		field string
	}{
		{"no table", dynamostore.Config{}, "TableName"},
		{"short table", dynamostore.Config{TableName: "ab"}, "TableName"},
		{"bad table", dynamostore.Config{TableName: "a b c"}, "TableName"},
		{"prefix with separator", dynamostore.Config{TableName: "t-1", KeyPrefix: "A#B"}, "KeyPrefix"},
		{"same key names", dynamostore.Config{TableName: "t-1", PartitionKeyAttributeName: "K", SortKeyAttributeName: "K"}, "SortKeyAttributeName"},
		{"default clash", dynamostore.Config{TableName: "t-1", PartitionKeyAttributeName: "SK"}, "SortKeyAttributeName"},
		{"prefix over the key limit", dynamostore.Config{TableName: "t-1", KeyPrefix: strings.Repeat("p", 2029)}, "KeyPrefix"},
		{"prefix not UTF-8", dynamostore.Config{TableName: "t-1", KeyPrefix: "\xff"}, "KeyPrefix"},
		{"long key name", dynamostore.Config{TableName: "t-1", PartitionKeyAttributeName: strings.Repeat("k", 256)}, "PartitionKeyAttributeName"},
		{"negative buckets", dynamostore.Config{TableName: "t-1", BucketCount: -1}, "BucketCount"},
		{"negative concurrency", dynamostore.Config{TableName: "t-1", MaxConcurrency: -2}, "MaxConcurrency"},
		{"negative count limit", dynamostore.Config{TableName: "t-1", PendingCountLimit: -3}, "PendingCountLimit"},
	}
	for _, c := range cases {
		err := c.opts.Validate()
		require.ErrorIs(t, err, outbox.ErrMisconfigured, c.name)
		assert.Contains(t, err.Error(), "Config."+c.field, c.name)
	}
	require.NoError(t, dynamostore.Config{TableName: "orders-outbox"}.Validate())
	require.NoError(t, dynamostore.Config{TableName: "orders-outbox", KeyPrefix: strings.Repeat("p", 2028)}.Validate())

	s, err := dynamostore.New(ddb.New(ddb.Options{Region: "us-east-1"}), dynamostore.Config{TableName: "orders-outbox"})
	require.NoError(t, err)
	got := s.Config()
	assert.Equal(t, "PK", got.PartitionKeyAttributeName)
	assert.Equal(t, "SK", got.SortKeyAttributeName)
	assert.Equal(t, "OUTBOX", got.KeyPrefix)
	assert.Equal(t, 8, got.BucketCount)
	assert.Equal(t, 8, got.MaxConcurrency)
	assert.Equal(t, 10_000, got.PendingCountLimit)
	_, err = dynamostore.New(nil, dynamostore.Config{TableName: "orders-outbox"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
}
