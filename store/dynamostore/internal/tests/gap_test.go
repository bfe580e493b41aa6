package tests

import (
	"context"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// readCommittedClient wraps the real client and, while armed, drops one chosen
// message from the next full-bucket Query: the answer DynamoDB may give a query that
// runs while a transaction commits (a later message of the transaction without an
// earlier one).
type readCommittedClient struct {
	dynamostore.Client
	mu     sync.Mutex
	hideSK string
	probes int
}

func (c *readCommittedClient) Query(ctx context.Context, in *ddb.QueryInput, opts ...func(*ddb.Options)) (*ddb.QueryOutput, error) {
	out, err := c.Client.Query(ctx, in, opts...)
	if err != nil {
		return out, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if aws.ToString(in.KeyConditionExpression) != "#pk = :pk" {
		c.probes++
		return out, nil
	}
	if c.hideSK == "" {
		return out, nil
	}
	kept := out.Items[:0]
	for _, item := range out.Items {
		if item["SK"].(*types.AttributeValueMemberS).Value == c.hideSK {
			c.hideSK = "" // once
			continue
		}
		kept = append(kept, item)
	}
	out.Items = kept
	return out, nil
}

func TestFetchProbesGapsOfATransactionCaughtMidCommit(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()
	wrapped := &readCommittedClient{Client: d.client}
	relay, err := dynamostore.New(wrapped, s.Config())
	require.NoError(t, err)

	envs := []*driver.Envelope{
		envelope(t, 1, "t", []byte("k"), []byte("1")),
		envelope(t, 1, "t", []byte("k"), []byte("2")),
		envelope(t, 1, "t", []byte("k"), []byte("3")),
		envelope(t, 1, "t", []byte("k"), []byte("4")),
	}
	require.NoError(t, s.Driver().Enqueue(ctx, envs...))

	// The first read misses message 2 of the transaction; the probe of the gap
	// between 1 and 3 finds it, and the head is read again.
	wrapped.hideSK = "0000000000000000002"
	got, err := envelopesOf(relay.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Equal(t, []string{"1", "2", "3", "4"}, payloadsOf(got))
	assert.Equal(t, 1, wrapped.probes, "one gap, one probe")

	// After the head was removed, probing starts above the last removed message.
	require.NoError(t, relay.Driver().Complete(ctx, got[:2]))
	wrapped.probes = 0
	got, err = envelopesOf(relay.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Equal(t, []string{"3", "4"}, payloadsOf(got))
	assert.Equal(t, 0, wrapped.probes, "no gap above the last removed message")

	// A message missing right below the head, as on a fresh start, is found too.
	relay2, err := dynamostore.New(wrapped, s.Config())
	require.NoError(t, err)
	wrapped.hideSK = "0000000000000000003"
	got, err = envelopesOf(relay2.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Equal(t, []string{"3", "4"}, payloadsOf(got))
}

func TestFetchProbesAtMostEightGaps(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()
	var envs []*driver.Envelope
	for range 30 {
		envs = append(envs, envelope(t, 1, "t", []byte("k"), []byte("x")))
	}
	require.NoError(t, s.Driver().Enqueue(ctx, envs...))
	// Every other message is gone: abandoned reservations look just like this.
	var odd []*driver.Envelope
	for i, e := range envs {
		if i%2 == 1 {
			odd = append(odd, e)
		}
	}
	require.NoError(t, s.Driver().Complete(ctx, odd))
	wrapped := &readCommittedClient{Client: d.client}
	relay, err := dynamostore.New(wrapped, s.Config())
	require.NoError(t, err)
	got, err := envelopesOf(relay.Driver().Fetch(ctx, 0, 100))
	require.NoError(t, err)
	assert.Len(t, got, 9, "the batch stops before the ninth gap, which was not probed")
	assert.Equal(t, 8, wrapped.probes, "probes per fetch are capped")
	got, err = envelopesOf(relay.Driver().Fetch(ctx, 0, 100))
	require.NoError(t, err)
	assert.Len(t, got, 9)
	assert.Equal(t, 16, wrapped.probes, "a batch fetched again is probed again")
}

// TestLateLowerSequenceIsDeliveredInOrder: a writer reserves a sequence number, a
// second writer commits a later one for the same key, a relay fetches that one, and
// only then does the first writer commit. The earlier message is still delivered, and
// before the later one.
func TestLateLowerSequenceIsDeliveredInOrder(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	ctx := context.Background()

	items, err := createItems(t, s, message("orders", []byte("order-7"), []byte("created"))) // reserved, not committed
	require.NoError(t, err)
	require.Len(t, items, 1)
	second := envelope(t, 2, "orders", []byte("order-7"), []byte("paid"))
	require.NoError(t, s.Driver().Enqueue(ctx, second))
	require.Less(t, itemSeq(t, items[0]), second.Seq)

	got, err := envelopesOf(s.Driver().Fetch(ctx, second.Bucket, 10))
	require.NoError(t, err)
	assert.Equal(t, []string{"paid"}, payloadsOf(got), "the relay sees only the later message")

	_, err = d.client.TransactWriteItems(ctx, &ddb.TransactWriteItemsInput{TransactItems: items})
	require.NoError(t, err)
	got, err = envelopesOf(s.Driver().Fetch(ctx, second.Bucket, 10))
	require.NoError(t, err)
	assert.Equal(t, []string{"created", "paid"}, payloadsOf(got), "fetched again, the bucket is in sequence order")

	rec := outboxtest.NewRecorder()
	disp, err := relay.New(s, rec, relay.Config{RelayID: "relay-1", BucketCount: 2})
	require.NoError(t, err)
	_, err = disp.RunOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"created", "paid"}, payloadsOf(rec.Messages()))
	left, err := envelopesOf(s.Driver().Fetch(ctx, second.Bucket, 10))
	require.NoError(t, err)
	assert.Empty(t, left)
}

func payloadsOf(envs []*driver.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = string(e.Payload)
	}
	return out
}
