package tests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/dynamostore/dynamostreams"
	"github.com/outboxkit/outbox/store/memstore"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// keyFor returns a key that lands in bucket among n buckets.
func keyFor(t testing.TB, bucket, n int) []byte {
	t.Helper()
	for i := range 10_000 {
		k := fmt.Appendf(nil, "key-%d", i)
		if driver.BucketOf(&outbox.Message{Key: k}, n) == bucket {
			return k
		}
	}
	t.Fatalf("no key for bucket %d", bucket)
	return nil
}

// enqueue writes n messages of key, one Enqueue each, and returns them.
func enqueue(t testing.TB, s *dynamostore.Store, key []byte, n int) []*driver.Envelope {
	t.Helper()
	var envs []*driver.Envelope
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: key, Payload: fmt.Appendf(nil, "%s-%d", key, i+1)}, s.Driver().BucketCount())
		require.NoError(t, err)
		require.NoError(t, s.Driver().Enqueue(context.Background(), env))
		envs = append(envs, env)
	}
	return envs
}

func payloads(envs []*driver.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = string(e.Payload)
	}
	return out
}

// inserts adds an INSERT record for each envelope's item, with the key read back
// from the table.
func inserts(t *testing.T, d *testDB, s *dynamostore.Store, st *streamOf, envs ...*driver.Envelope) []string {
	t.Helper()
	var ids []string
	for _, e := range envs {
		pk := fmt.Sprintf("OUTBOX#MESSAGES#%d", e.Bucket)
		sk := fmt.Sprintf("%019d", e.Seq)
		require.Contains(t, keysOf(t, d, s.Config().TableName, pk), sk, "the item is in the table")
		ids = append(ids, st.add(events.DynamoDBOperationTypeInsert, pk, sk))
	}
	return ids
}

func newHandlerB(t testing.TB, s *dynamostore.Store, rec driver.Transport) (*relay.Relay, *dynamostreams.Handler) {
	return newHandler(t, s, rec, "lambda-bench")
}

func newHandler(t testing.TB, s *dynamostore.Store, rec driver.Transport, id string) (*relay.Relay, *dynamostreams.Handler) {
	t.Helper()
	disp, err := relay.New(s, rec, relay.Config{
		RelayID: id, BucketCount: s.Driver().BucketCount(), BackoffBase: time.Millisecond, BackoffMax: time.Millisecond,
		BacklogInterval: -1, Logger: quiet(),
	})
	require.NoError(t, err)
	h, err := dynamostreams.New(disp, s.Driver(), dynamostreams.Config{Logger: quiet()})
	require.NoError(t, err)
	return disp, h
}

// TestHandlerDispatchesWhatTheStreamNames: the handler drains exactly the buckets
// and Seqs the INSERT records name, in order, ignores every other record, and hands
// its leases back.
func TestHandlerDispatchesWhatTheStreamNames(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	ka, kb := keyFor(t, 0, 2), keyFor(t, 1, 2)
	a := enqueue(t, s, ka, 5)
	b := enqueue(t, s, kb, 3)

	var st streamOf
	inserts(t, d, s, &st, a[:3]...)
	st.add(events.DynamoDBOperationTypeInsert, "OUTBOX#SEQUENCE#0", "SEQUENCE")
	st.add(events.DynamoDBOperationTypeInsert, "OUTBOX#COORDINATION", "LEASE#0000000000")
	st.add(events.DynamoDBOperationTypeModify, "OUTBOX#MESSAGES#0", fmt.Sprintf("%019d", a[3].Seq))
	st.add(events.DynamoDBOperationTypeRemove, "OUTBOX#MESSAGES#0", fmt.Sprintf("%019d", a[4].Seq))
	st.add(events.DynamoDBOperationTypeInsert, "ORDER#1", "ORDER")
	st.add(events.DynamoDBOperationTypeInsert, "OTHER#MESSAGES#0", fmt.Sprintf("%019d", a[4].Seq))
	inserts(t, d, s, &st, b...)

	rec := outboxtest.NewRecorder()
	_, h := newHandler(t, s, rec, "lambda-1")
	resp, err := h.Handle(context.Background(), st.ev)
	require.NoError(t, err)
	assert.Empty(t, resp.BatchItemFailures)
	byKey := rec.ByKey()
	assert.Equal(t, payloads(a[:3]), payloads(byKey[string(ka)]), "bucket 0 up to the highest Seq named, in order")
	assert.Equal(t, payloads(b), payloads(byKey[string(kb)]))
	assert.Equal(t, 6, rec.Len())
	assert.Equal(t, []string{fmt.Sprintf("%019d", a[3].Seq), fmt.Sprintf("%019d", a[4].Seq)},
		keysOf(t, d, s.Config().TableName, "OUTBOX#MESSAGES#0"), "what the stream did not name stays")

	view, err := s.Driver().ReadCoordination(context.Background())
	require.NoError(t, err)
	for _, l := range view.Leases {
		assert.Empty(t, l.Owner, "the buckets claimed for the dispatch are released")
	}

	// The same event again (Lambda may deliver a batch twice): nothing more goes out.
	resp, err = h.Handle(context.Background(), st.ev)
	require.NoError(t, err)
	assert.Empty(t, resp.BatchItemFailures)
	assert.Equal(t, 6, rec.Len())
}

// failingQueries fails every Query of one partition while armed: that bucket's
// store calls fail, the others' do not.
type failingQueries struct {
	dynamostore.Client
	pk    string
	armed atomic.Bool
}

func (c *failingQueries) Query(ctx context.Context, in *ddb.QueryInput, opts ...func(*ddb.Options)) (*ddb.QueryOutput, error) {
	if v, ok := in.ExpressionAttributeValues[":pk"].(*types.AttributeValueMemberS); ok && v.Value == c.pk && c.armed.Load() {
		return nil, errors.New("injected: the table is unreachable")
	}
	return c.Client.Query(ctx, in, opts...)
}

// TestHandlerReportsTheRecordsOfFailedBuckets: a bucket whose dispatch fails has all
// its records reported for Lambda to retry, and only those; the retry delivers them,
// in order and once.
func TestHandlerReportsTheRecordsOfFailedBuckets(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	base := d.newStore(t, dynamostore.Config{BucketCount: 2})
	client := &failingQueries{Client: d.client, pk: "OUTBOX#MESSAGES#1"}
	s, err := dynamostore.New(client, base.Config())
	require.NoError(t, err)
	ka, kb := keyFor(t, 0, 2), keyFor(t, 1, 2)
	a := enqueue(t, s, ka, 2)
	b := enqueue(t, s, kb, 2)
	var st streamOf
	inserts(t, d, s, &st, a...)
	failing := inserts(t, d, s, &st, b...)
	// A record whose bucket is outside the store's count: a misconfiguration.
	bad := st.add(events.DynamoDBOperationTypeInsert, "OUTBOX#MESSAGES#7", fmt.Sprintf("%019d", 1))

	rec := outboxtest.NewRecorder()
	_, h := newHandler(t, s, rec, "lambda-1")
	client.armed.Store(true)
	resp, err := h.Handle(context.Background(), st.ev)
	require.NoError(t, err)
	var got []string
	for _, f := range resp.BatchItemFailures {
		got = append(got, f.ItemIdentifier)
	}
	assert.ElementsMatch(t, append(failing, bad), got)
	assert.Equal(t, payloads(a), payloads(rec.ByKey()[string(ka)]))
	assert.Empty(t, rec.ByKey()[string(kb)])

	// Lambda retries the batch from the earliest failed record: the rest goes out.
	client.armed.Store(false)
	var retry streamOf
	inserts(t, d, s, &retry, b...)
	resp, err = h.Handle(context.Background(), retry.ev)
	require.NoError(t, err)
	assert.Empty(t, resp.BatchItemFailures)
	assert.Equal(t, payloads(b), payloads(rec.ByKey()[string(kb)]))
	assert.Zero(t, rec.Duplicates())
}

// TestHandlerKeepsLeaseAndKeyOrder: a bucket another relay holds is left to it; a
// message whose publish fails holds its key's later messages back, its record counts
// as handled, and the scheduled sweep delivers the key in order.
func TestHandlerKeepsLeaseAndKeyOrder(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	ctx := context.Background()
	ka, kb := keyFor(t, 0, 2), keyFor(t, 1, 2)
	a := enqueue(t, s, ka, 3)
	b := enqueue(t, s, kb, 1)

	now := time.Now()
	ok, err := s.Driver().Claim(ctx, 1, "worker-elsewhere", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)

	rec := outboxtest.NewRecorder()
	rec.FailID(a[0].ID, errors.New("broker refused"), 1)
	disp, h := newHandler(t, s, rec, "lambda-1")
	var st streamOf
	inserts(t, d, s, &st, a...)
	inserts(t, d, s, &st, b...)
	resp, err := h.Handle(ctx, st.ev)
	require.NoError(t, err)
	assert.Empty(t, resp.BatchItemFailures, "a failed publish is the relay's to retry; a held bucket is its holder's")
	assert.Zero(t, rec.Len(), "nothing of key a goes out before its first message; bucket 1 is held elsewhere")

	// The safety net: a sweep after the backoff delivers key a in order.
	time.Sleep(5 * time.Millisecond)
	_, err = disp.RunOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, payloads(a), payloads(rec.ByKey()[string(ka)]))
	assert.Empty(t, rec.ByKey()[string(kb)], "bucket 1 is still held by its owner")
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	disp, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: "r", Logger: quiet()})
	require.NoError(t, err)
	_, err = dynamostreams.New(nil, s.Driver(), dynamostreams.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = dynamostreams.New(disp, nil, dynamostreams.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	mem, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	_, err = dynamostreams.New(disp, mem.Driver(), dynamostreams.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "another kind of store has no stream keys")
	assert.Contains(t, err.Error(), "Driver()")
	_, err = dynamostreams.New(disp, s.Driver(), dynamostreams.Config{MaxConcurrency: -1})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "Config.MaxConcurrency")
}
