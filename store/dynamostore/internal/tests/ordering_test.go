package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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

// midCommitClient wraps the real client and drops, from each of the next full-bucket
// Queries, the message named for it: the answer DynamoDB may give a query that runs
// while a transaction commits (a later message of the transaction without an earlier
// one), once per read.
type midCommitClient struct {
	dynamostore.Client
	mu     sync.Mutex
	hide   []int64 // per upcoming read, the Seq it misses
	reads  int
	probes int
}

func (c *midCommitClient) Query(ctx context.Context, in *ddb.QueryInput, opts ...func(*ddb.Options)) (*ddb.QueryOutput, error) {
	out, err := c.Client.Query(ctx, in, opts...)
	if err != nil {
		return out, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if aws.ToString(in.KeyConditionExpression) != "#pk = :pk" || !aws.ToBool(in.ConsistentRead) {
		c.probes++
		return out, nil
	}
	c.reads++
	if len(c.hide) == 0 {
		return out, nil
	}
	sk := fmt.Sprintf("%019d", c.hide[0])
	c.hide = c.hide[1:]
	out.Items = slicesDeleteSK(out.Items, sk)
	return out, nil
}

func slicesDeleteSK(items []map[string]types.AttributeValue, sk string) []map[string]types.AttributeValue {
	kept := items[:0:0]
	for _, item := range items {
		if item["SK"].(*types.AttributeValueMemberS).Value != sk {
			kept = append(kept, item)
		}
	}
	return kept
}

func (c *midCommitClient) arm(seqs ...int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hide, c.reads, c.probes = seqs, 0, 0
}

// drainInOrder runs sweeps until bucket 0 is empty and returns the payloads of the
// deliveries per key, in order.
func drainInOrder(t *testing.T, s *dynamostore.Store, bucketCount int) map[string][]string {
	t.Helper()
	ctx := context.Background()
	rec := outboxtest.NewRecorder()
	disp, err := relay.New(s, rec, relay.Config{
		RelayID: "relay-order", BucketCount: bucketCount, BatchSize: 100,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	for sweep := 0; ; sweep++ {
		require.Less(t, sweep, 50, "the bucket does not drain")
		_, err := disp.RunOnce(ctx)
		require.NoError(t, err)
		left, err := envelopesOf(s.Driver().Fetch(ctx, 0, 1))
		require.NoError(t, err)
		if len(left) == 0 {
			break
		}
	}
	require.Zero(t, rec.Duplicates())
	out := map[string][]string{}
	for k, envs := range rec.ByKey() {
		out[k] = payloadsOf(envs)
	}
	return out
}

// TestFetchProbesBelowTheHeadFirstPastEightGaps: a batch with more inner gaps than
// a fetch probes (abandoned reservations leave such gaps), and the head of a
// transaction caught mid-commit: the query sees Seq 2 of the transaction but not
// Seq 1. The range below the first fetched message is probed first, so the head is
// found, and no message above an unprobed gap is returned.
func TestFetchProbesBelowTheHeadFirstPastEightGaps(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()

	// Seq 1 and 2: one transaction for key k.
	require.NoError(t, s.Enqueue(ctx,
		message("t", []byte("k"), []byte("k-1")),
		message("t", []byte("k"), []byte("k-2"))))
	// Seq 3..26: an abandoned reservation, then a committed message, twelve times:
	// twelve inner gaps.
	var want []string
	for i := range 12 {
		_, err := createItems(t, s, message("t", []byte("other"), []byte("abandoned")))
		require.NoError(t, err)
		p := fmt.Sprintf("o-%d", i)
		want = append(want, p)
		require.NoError(t, s.Driver().Enqueue(ctx, envelope(t, 1, "t", []byte("other"), []byte(p))))
	}

	wrapped := &midCommitClient{Client: d.client}
	relay, err := dynamostore.New(wrapped, s.Config())
	require.NoError(t, err)
	wrapped.arm(1)
	got, err := envelopesOf(relay.Driver().Fetch(ctx, 0, 100))
	require.NoError(t, err)
	require.NotEmpty(t, got)
	assert.Equal(t, int64(1), got[0].Seq, "first fetched seq")
	assert.Equal(t, []string{"k-1", "k-2"}, payloadsOf(got[:2]))
	// The last message returned lies below the ninth gap: eight gaps were probed.
	last := got[len(got)-1]
	assert.Equal(t, int64(2+2*8), last.Seq, "the batch stops before the first unprobed gap")
	assert.Equal(t, 2, wrapped.reads, "a probe found the head: the head is read again")
	for i := 1; i < len(got); i++ {
		assert.Less(t, got[i-1].Seq, got[i].Seq)
	}

	// Dispatched through the relay with the same fault, every key keeps its order.
	wrapped.arm(1)
	delivered := drainInOrder(t, relay, 1)
	assert.Equal(t, map[string][]string{"k": {"k-1", "k-2"}, "other": want}, delivered)
}

// TestFetchCutsTheLastReadAtAFilledGap: three reads in a row each miss a message of
// a transaction caught mid-commit. The third read gets no read after it, so its
// batch is cut before the gap a probe found filled, and the bucket is still
// delivered in order.
func TestFetchCutsTheLastReadAtAFilledGap(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()
	var envs []*driver.Envelope
	for i := 1; i <= 5; i++ {
		envs = append(envs, envelope(t, 1, "t", []byte("k"), fmt.Appendf(nil, "%d", i)))
	}
	require.NoError(t, s.Driver().Enqueue(ctx, envs...))

	wrapped := &midCommitClient{Client: d.client}
	relay, err := dynamostore.New(wrapped, s.Config())
	require.NoError(t, err)
	wrapped.arm(3, 2, 4)
	got, err := envelopesOf(relay.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Equal(t, 3, wrapped.reads, "three reads, each caught mid-commit")
	assert.Equal(t, []string{"1", "2", "3"}, payloadsOf(got), "cut before the gap the third read left")

	// The head missing on every read: nothing is returned rather than a later message.
	relay2, err := dynamostore.New(wrapped, s.Config())
	require.NoError(t, err)
	wrapped.arm(1, 1, 1)
	got, err = envelopesOf(relay2.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Empty(t, got)

	wrapped.arm(2, 3, 2)
	assert.Equal(t, map[string][]string{"k": {"1", "2", "3", "4", "5"}}, drainInOrder(t, relay2, 1))
}
