package tests

import (
	"context"
	"errors"
	"strconv"
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

// rawItem reads one item with a strongly consistent query, bypassing the store.
func rawItem(t *testing.T, d *testDB, table, pk, sk string) map[string]types.AttributeValue {
	t.Helper()
	out, err := d.client.Query(context.Background(), &ddb.QueryInput{
		TableName:              aws.String(table),
		KeyConditionExpression: aws.String("PK = :pk AND SK = :sk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk": &types.AttributeValueMemberS{Value: pk}, ":sk": &types.AttributeValueMemberS{Value: sk},
		},
		ConsistentRead: aws.Bool(true),
	})
	require.NoError(t, err)
	if len(out.Items) == 0 {
		return nil
	}
	return out.Items[0]
}

func TestItemSchema(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 4})
	table := s.Config().TableName
	ctx := context.Background()

	part := int32(6)
	keyed, err := driver.NewEnvelope(outbox.Message{
		Topic: "orders", Key: []byte("k-1"), Payload: []byte{0, 1, 2, 0xff},
		Headers:   []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "a", Value: nil}, {Key: "b", Value: []byte{}}},
		Partition: &part,
	}, 4)
	require.NoError(t, err)
	keyed.CreatedAt = time.Date(2026, 3, 4, 5, 6, 7, 123456700, time.UTC)
	tombstone := envelope(t, 4, "orders", []byte{}, nil) // empty key, nil payload
	require.NoError(t, s.Driver().Enqueue(ctx, keyed))
	require.NoError(t, s.Driver().Enqueue(ctx, tombstone))

	require.Equal(t, 2, keyed.Bucket, "partition 6 modulo 4 buckets")
	item := rawItem(t, d, table, "OUTBOX#MESSAGES#2", "0000000000000000001")
	require.NotNil(t, item, "message item under OUTBOX#MESSAGES#{bucket} / 19-digit sequence")
	assert.Equal(t, keyed.ID.String(), item["MessageId"].(*types.AttributeValueMemberS).Value)
	assert.Equal(t, "orders", item["Topic"].(*types.AttributeValueMemberS).Value)
	assert.Equal(t, []byte("k-1"), item["Key"].(*types.AttributeValueMemberB).Value)
	assert.Equal(t, []byte{0, 1, 2, 0xff}, item["Value"].(*types.AttributeValueMemberB).Value)
	assert.Equal(t, "6", item["Partition"].(*types.AttributeValueMemberN).Value)
	assert.Equal(t, "4", item["BucketCount"].(*types.AttributeValueMemberN).Value)
	// 2026-03-04T05:06:07.1234567Z in .NET ticks.
	assert.Equal(t, "639081975671234567", item["CreatedAtUtc"].(*types.AttributeValueMemberN).Value)
	headers := item["Headers"].(*types.AttributeValueMemberB).Value
	assert.Equal(t, byte(1), headers[0], "leading version byte")
	assert.Equal(t, driver.EncodeHeaders(keyed.Headers), headers)
	for _, absent := range []string{"Attempts", "NextAttemptAtUtc", "LastError"} {
		assert.NotContains(t, item, absent)
	}

	counter := rawItem(t, d, table, "OUTBOX#SEQUENCE#2", "SEQUENCE")
	require.NotNil(t, counter)
	assert.Equal(t, "1", counter["Sequence"].(*types.AttributeValueMemberN).Value)

	tomb := rawItem(t, d, table, "OUTBOX#MESSAGES#"+itoa(tombstone.Bucket), "0000000000000000001")
	require.NotNil(t, tomb)
	assert.NotContains(t, tomb, "Value", "a tombstone has no Value")
	assert.NotContains(t, tomb, "Headers")
	assert.Contains(t, tomb, "Key", "an empty key is a real key")

	got, err := envelopesOf(s.Driver().Fetch(ctx, keyed.Bucket, 10))
	require.NoError(t, err)
	require.NotEmpty(t, got)
	var back *driver.Envelope
	for _, e := range got {
		if e.ID == keyed.ID {
			back = e
		}
	}
	require.NotNil(t, back)
	assert.Equal(t, keyed.Message, back.Message)
	assert.True(t, keyed.CreatedAt.Equal(back.CreatedAt))
	assert.Equal(t, int64(1), back.Seq)
	assert.Equal(t, 4, back.BucketCount)

	got, err = envelopesOf(s.Driver().Fetch(ctx, tombstone.Bucket, 10))
	require.NoError(t, err)
	for _, e := range got {
		if e.ID == tombstone.ID {
			assert.NotNil(t, e.Key)
			assert.Empty(t, e.Key)
			assert.Nil(t, e.Payload)
			assert.Nil(t, e.Headers)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestReservationsPerBucketKeepListOrder(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 4})
	ctx := context.Background()
	k0, k1 := keyForBucket(t, 0, 4), keyForBucket(t, 1, 4)
	items, err := createItems(t, s,
		message("t", k0, []byte("a")),
		message("t", k1, []byte("b")),
		message("t", k0, []byte("c")),
		message("t", k0, []byte("d")),
		message("t", k1, []byte("e")))
	require.NoError(t, err)
	reqs, _ := d.proxy.take()
	assert.Equal(t, 2, reqs["UpdateItem"], "one reservation per distinct bucket")
	require.Len(t, items, 5)
	var seqs []int64
	for _, it := range items {
		require.NotNil(t, it.Put)
		assert.Contains(t, aws.ToString(it.Put.ConditionExpression), "attribute_not_exists")
		seqs = append(seqs, itemSeq(t, it))
	}
	assert.Equal(t, []int64{1, 1, 2, 3, 2}, seqs, "in send order, numbered per bucket")

	// The caller's own transaction, with its business item.
	order := types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(s.Config().TableName),
		Item: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: "ORDER#1"}, "SK": &types.AttributeValueMemberS{Value: "ORDER"},
		},
	}}
	sub := side(s).Subscribe(ctx)
	request := append([]types.TransactWriteItem{order}, items...)
	_, err = d.client.TransactWriteItems(ctx, &ddb.TransactWriteItemsInput{TransactItems: request})
	require.NoError(t, err)
	s.NotifyCommitted(request...) // the order is not a message: ignored
	woke := map[int]bool{<-sub: true, <-sub: true}
	assert.Equal(t, map[int]bool{0: true, 1: true}, woke)

	got, err := envelopesOf(s.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	require.Len(t, got, 3)
	assert.Equal(t, []string{"a", "c", "d"}, []string{string(got[0].Payload), string(got[1].Payload), string(got[2].Payload)})
}

func TestEnqueueIsSafeUnderSDKRetries(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	ctx := context.Background()

	// One envelope goes out as a conditional PutItem; its first response is lost, the
	// SDK retries, the retry finds the item written by the first attempt.
	one := envelope(t, 2, "t", []byte("k"), []byte("one"))
	d.proxy.loseNext("PutItem", 1)
	require.NoError(t, s.Driver().Enqueue(ctx, one))

	// Several go out as one transaction; same story.
	many := []*driver.Envelope{
		envelope(t, 2, "t", []byte("k"), []byte("two")),
		envelope(t, 2, "t", []byte("k"), []byte("three")),
		envelope(t, 2, "t", []byte("other"), []byte("four")),
	}
	d.proxy.loseNext("TransactWriteItems", 1)
	require.NoError(t, s.Driver().Enqueue(ctx, many...))
	reqs, _ := d.proxy.take()
	assert.Equal(t, 2, reqs["TransactWriteItems"], "the lost response was retried by the SDK")
	assert.Equal(t, 2, reqs["PutItem"])

	var all []*driver.Envelope
	for b := range 2 {
		got, err := envelopesOf(s.Driver().Fetch(ctx, b, 10))
		require.NoError(t, err)
		all = append(all, got...)
	}
	assert.Len(t, all, 4, "each envelope stored exactly once")

	// A counter that was reset makes the put collide with another message: an error,
	// not a silent overwrite.
	_, err := d.client.PutItem(ctx, &ddb.PutItemInput{
		TableName: aws.String(s.Config().TableName),
		Item: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: "OUTBOX#SEQUENCE#" + itoa(one.Bucket)}, "SK": &types.AttributeValueMemberS{Value: "SEQUENCE"},
			"Sequence": &types.AttributeValueMemberN{Value: "0"},
		},
	})
	require.NoError(t, err)
	clash := envelope(t, 2, "t", []byte("k"), []byte("clash"))
	err = s.Driver().Enqueue(ctx, clash)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already taken")
}

func TestBucketCountMismatch(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	relay := d.newStore(t, dynamostore.Config{BucketCount: 8})
	ctx := context.Background()

	err := relay.Driver().Enqueue(ctx, envelope(t, 4, "t", []byte("k"), nil))
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	// A writer configured with 4 buckets on the same table and prefix.
	writer, err := dynamostore.New(d.client, dynamostore.Config{TableName: relay.Config().TableName, BucketCount: 4})
	require.NoError(t, err)
	env := envelope(t, 4, "t", keyForBucket(t, 1, 4), nil)
	require.NoError(t, writer.Driver().Enqueue(ctx, env))
	_, err = relay.Driver().Fetch(ctx, 1, 10)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = relay.Driver().Fetch(ctx, 8, 10)
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "bucket beyond the count")
}

func TestKeyPrefixIsolation(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	a := d.newStore(t, dynamostore.Config{BucketCount: 2})
	b, err := dynamostore.New(d.client, dynamostore.Config{TableName: a.Config().TableName, BucketCount: 2, KeyPrefix: "BILLING"})
	require.NoError(t, err)
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)

	for b2 := range 2 {
		require.NoError(t, a.Driver().Enqueue(ctx, envelope(t, 2, "a", keyForBucket(t, b2, 2), []byte("a"))))
	}
	require.NoError(t, b.Driver().Enqueue(ctx, envelope(t, 2, "b", keyForBucket(t, 0, 2), []byte("b"))))
	ok, err := a.Driver().Claim(ctx, 0, "relay-a", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = b.Driver().Claim(ctx, 0, "relay-b", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok, "the other outbox's lease is not this one's")
	_, err = a.Driver().Heartbeat(ctx, "relay-a", now, 2, driver.Instance{})
	require.NoError(t, err)

	for bucket := range 2 {
		got, err := envelopesOf(b.Driver().Fetch(ctx, bucket, 10))
		require.NoError(t, err)
		for _, e := range got {
			assert.Equal(t, "b", e.Topic)
		}
	}
	coord, err := b.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	require.Len(t, coord.Leases, 1)
	assert.Equal(t, "relay-b", coord.Leases[0].Owner)
	assert.Empty(t, coord.Relays)
	st, err := side(b).Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 0}, st.Pending)
	st, err = side(a).Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 1}, st.Pending)
}

// failingQueries fails every Query with err.
type failingQueries struct {
	dynamostore.Client
	err error
}

func (c failingQueries) Query(context.Context, *ddb.QueryInput, ...func(*ddb.Options)) (*ddb.QueryOutput, error) {
	return nil, c.err
}

// TestCheck: the relay side's Check passes on a created table, fails with
// ErrMisconfigured naming the fix on a missing one (and a relay refuses to start on
// it), and passes other failures through, wrapped.
func TestCheck(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	require.NoError(t, s.Driver().Check(ctx))
	reqs, _ := d.proxy.take()
	assert.Equal(t, map[string]int{"Query": 1}, reqs, "one small read")

	missing, err := dynamostore.New(d.client, dynamostore.Config{TableName: uniqueTable(t), BucketCount: 2})
	require.NoError(t, err)
	err = missing.Driver().Check(ctx)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "dynamostore.CreateIfNotExists", "names the function that creates the table")
	assert.Contains(t, err.Error(), missing.Config().TableName)
	_, ok := errors.AsType[*types.ResourceNotFoundException](err)
	assert.True(t, ok, "the SDK's exception stays reachable: %v", err)

	disp, err := relay.New(missing, outboxtest.NewRecorder(), relay.Config{RelayID: "relay-1"})
	require.NoError(t, err)
	require.ErrorIs(t, disp.Start(ctx), outbox.ErrMisconfigured, "a relay does not start on a missing table")

	require.NoError(t, dynamostore.CreateIfNotExists(ctx, d.client, missing.Config()))
	require.NoError(t, missing.Driver().Check(ctx), "created, the table passes")

	cause := errors.New("connection reset")
	broken, err := dynamostore.New(failingQueries{d.client, cause}, s.Config())
	require.NoError(t, err)
	err = broken.Driver().Check(ctx)
	require.ErrorIs(t, err, cause)
	assert.NotErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "dynamostore: ")

	require.NoError(t, s.Close())
	require.ErrorIs(t, s.Driver().Check(ctx), outbox.ErrClosed)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, missing.Driver().Check(cancelled), context.Canceled)
}
