package dynamostore_test

import (
	"testing"

	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/store/dynamostore"
)

func TestMessageKey(t *testing.T) {
	t.Parallel()
	s, err := dynamostore.New(ddb.New(ddb.Options{Region: "us-east-1"}), dynamostore.Config{TableName: "t-1", KeyPrefix: "SHOP"})
	require.NoError(t, err)
	keys, ok := s.Driver().(interface {
		MessageKey(pk, sk string) (bucket int, seq int64, ok bool)
	})
	require.True(t, ok, "the relay side reads stream record keys")
	b, seq, ok := keys.MessageKey("SHOP#MESSAGES#12", "0000000000000000042")
	assert.True(t, ok)
	assert.Equal(t, 12, b)
	assert.Equal(t, int64(42), seq)
	for _, k := range [][2]string{
		{"OUTBOX#MESSAGES#12", "0000000000000000042"}, // another prefix
		{"SHOP#PARKED#12", "0000000000000000042"},
		{"SHOP#SEQUENCE#12", "SEQUENCE"},
		{"SHOP#COORDINATION", "LEASE#0000000012"},
		{"SHOP#MESSAGES#012", "0000000000000000042"}, // not how the store writes a bucket
		{"SHOP#MESSAGES#-1", "0000000000000000042"},
		{"SHOP#MESSAGES#12", "42"},
		{"SHOP#MESSAGES#12", "000000000000000004x"},
		{"ORDER#12", "ORDER"},
	} {
		_, _, ok := keys.MessageKey(k[0], k[1])
		assert.False(t, ok, "%v", k)
	}
}
