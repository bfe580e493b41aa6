package tests

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// TestProxyEnforcesDynamoDBSizeLimits: the proxy in front of the API server refuses
// what DynamoDB refuses, so the size tests below are real.
func TestProxyEnforcesDynamoDBSizeLimits(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	table := s.Config().TableName
	ctx := context.Background()
	put := func(pk, sk string, size int) error {
		_, err := d.client.PutItem(ctx, &ddb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: pk}, "SK": &types.AttributeValueMemberS{Value: sk},
			"V": &types.AttributeValueMemberB{Value: make([]byte, size)},
		}})
		return err
	}
	// Names and keys take 2+1+2+1+1 bytes.
	require.NoError(t, put("a", "b", 400*1024-7))
	err := put("a", "b", 400*1024-6)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "ValidationException")
	require.NoError(t, put(strings.Repeat("p", 2048), strings.Repeat("s", 1024), 1))
	assert.ErrorContains(t, put(strings.Repeat("p", 2049), "b", 1), "hashkey")
	assert.ErrorContains(t, put("a", strings.Repeat("s", 1025), 1), "range keys")

	// An update is sized on the item it would leave.
	require.NoError(t, put("a", "b", 400*1024-7-20))
	_, err = d.client.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName: aws.String(table), Key: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: "a"}, "SK": &types.AttributeValueMemberS{Value: "b"},
		},
		UpdateExpression:          aws.String("SET #e = :e"),
		ExpressionAttributeNames:  map[string]string{"#e": "E"},
		ExpressionAttributeValues: map[string]types.AttributeValue{":e": &types.AttributeValueMemberS{Value: strings.Repeat("e", 20)}},
	})
	assert.ErrorContains(t, err, "Item size to update has exceeded")
}

// TestMessageAtTheLimitCanFailSafely: a message of exactly the store's
// MaxMessageSize, with the longest error text the store keeps, is rescheduled on
// every failure and parked after MaxAttempts, against a server that enforces
// DynamoDB's item size; the later message of its key then goes out.
func TestMessageAtTheLimitCanFailSafely(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()

	msg := outbox.Message{Topic: "t", Key: []byte("k"), Headers: []outbox.Header{{Key: "h", Value: []byte("v")}}}
	msg.Payload = bytes.Repeat([]byte{'x'}, s.MaxMessageSize()-msg.Size())
	big, err := driver.NewEnvelope(msg, 1)
	require.NoError(t, err)
	require.Equal(t, s.MaxMessageSize(), big.Size())
	require.NoError(t, s.Driver().Enqueue(ctx, big))
	later := envelope(t, 1, "t", []byte("k"), []byte("later"))
	require.NoError(t, s.Driver().Enqueue(ctx, later))

	rec := outboxtest.NewRecorder()
	rec.FailID(big.ID, errors.New("broker refused the message: "+strings.Repeat("reason ", 1000)), -1)
	const attempts = 2
	disp, err := relay.New(s, rec, relay.Config{
		RelayID: "relay-big", BucketCount: 1, MaxAttempts: attempts,
		BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	parked := 0
	for sweep := 0; parked == 0; sweep++ {
		require.Less(t, sweep, 100*attempts, "the message was never parked")
		res, err := disp.RunOnce(ctx)
		require.NoError(t, err, "a failed publish of a message at the limit must be recorded")
		parked += res.Parked
		time.Sleep(2 * time.Millisecond) // the backoff
	}
	assert.Zero(t, d.proxy.overLimitSoFar("UpdateItem"))
	assert.Zero(t, d.proxy.overLimitSoFar("TransactWriteItems"))

	list, err := side(s).List(ctx, driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, big.ID, list[0].ID)
	assert.Equal(t, attempts, list[0].Attempts)
	assert.Len(t, list[0].LastError, 2048, "the error text is kept at its cap")
	assert.Equal(t, big.Payload, list[0].Payload)

	// The key is unblocked.
	_, err = disp.RunOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"later"}, payloadsOf(rec.ByKey()["k"]))
}

// TestWritesLeaveRoomToFail: an item that would not leave room for what a failed
// publish adds is refused at the write, with ErrTooLarge, not accepted to block its
// key later.
func TestWritesLeaveRoomToFail(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()
	env := envelope(t, 1, "t", []byte("k"), bytes.Repeat([]byte{'x'}, 400*1024-2000))
	err := s.Driver().Enqueue(ctx, env)
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	assert.Contains(t, err.Error(), "a failed publish may add")
	_, err = createItems(t, s, overItem(s))
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	assert.Contains(t, err.Error(), "a failed publish may add")
	reqs, _ := d.proxy.take()
	assert.Zero(t, reqs["UpdateItem"], "refused before any reservation")
	left, err := envelopesOf(s.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Empty(t, left)
}

// TestKeysAtDynamoDBsLimits: the longest KeyPrefix and relay id the store accepts
// work against a server that enforces DynamoDB's key sizes, and one byte more is
// refused before any request, naming the fix.
func TestKeysAtDynamoDBsLimits(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	_, err := dynamostore.New(d.client, dynamostore.Config{TableName: uniqueTable(t), KeyPrefix: strings.Repeat("p", 2029)})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "Config.KeyPrefix")

	s := d.newStore(t, dynamostore.Config{BucketCount: 8, KeyPrefix: strings.Repeat("p", 2028)})
	key := []byte("k")
	env := envelope(t, 8, "t", key, []byte("x"))
	require.NoError(t, s.Driver().Enqueue(ctx, env))
	got, err := envelopesOf(s.Driver().Fetch(ctx, env.Bucket, 1))
	require.NoError(t, err)
	require.Len(t, got, 1)
	// A message at the limit still fits with the longest prefix, and can fail safely.
	msg := outbox.Message{Topic: "t", Key: key}
	msg.Payload = bytes.Repeat([]byte{'x'}, s.MaxMessageSize()-msg.Size())
	atLimit, err := driver.NewEnvelope(msg, 8)
	require.NoError(t, err)
	require.NoError(t, s.Driver().Enqueue(ctx, atLimit))
	require.NoError(t, s.Driver().Reschedule(ctx, atLimit, time.Now(), strings.Repeat("e", 5000)))
	require.NoError(t, s.Driver().Park(ctx, atLimit, strings.Repeat("e", 5000)))

	relay := strings.Repeat("r", 1018)
	ok, err := s.Driver().Heartbeat(ctx, relay, time.Now(), 8, driver.Instance{})
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = s.Driver().Claim(ctx, 0, relay, time.Now(), time.Now().Add(time.Minute))
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, s.Driver().StopRelay(ctx, relay, time.Now()))

	tooLong := relay + "r"
	_, err = s.Driver().Heartbeat(ctx, tooLong, time.Now(), 8, driver.Instance{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "RelayID")
	_, err = s.Driver().Claim(ctx, 1, tooLong, time.Now(), time.Now().Add(time.Minute))
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorIs(t, s.Driver().StopRelay(ctx, tooLong, time.Now()), outbox.ErrMisconfigured)
	assert.Zero(t, d.proxy.overLimitSoFar("PutItem")+d.proxy.overLimitSoFar("UpdateItem")+d.proxy.overLimitSoFar("TransactWriteItems"))
}
