package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/dynamostore"
)

func TestCompleteBatchesAndRetriesUnprocessed(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()
	var envs []*driver.Envelope
	for range 60 {
		envs = append(envs, envelope(t, 1, "t", []byte("k"), []byte("x")))
	}
	require.NoError(t, s.Driver().Enqueue(ctx, envs[:50]...))
	require.NoError(t, s.Driver().Enqueue(ctx, envs[50:]...))
	d.proxy.take()

	// The first delete of every request comes back unprocessed twice.
	var left atomic.Int64
	left.Store(2 * 3)
	d.server.EmulateUnprocessedItems(s.Config().TableName, func(n int, _ map[string]*server.AttributeValue) bool {
		return n == 0 && left.Add(-1) >= 0
	})
	require.NoError(t, s.Driver().Complete(ctx, append(envs, envs[0]))) // a duplicate is dropped
	reqs, _ := d.proxy.take()
	assert.GreaterOrEqual(t, reqs["BatchWriteItem"], 3+2, "three requests of at most 25 keys, plus retries")
	assert.LessOrEqual(t, reqs["BatchWriteItem"], 3+6)
	got, err := envelopesOf(s.Driver().Fetch(ctx, 0, 100))
	require.NoError(t, err)
	assert.Empty(t, got)
	require.NoError(t, s.Driver().Complete(ctx, envs[:3]), "completing what is gone is not an error")

	// A delete that stays unprocessed fails the call; the message stays.
	d.server.ClearUnprocessedItems()
	kept := envelope(t, 1, "t", []byte("k"), []byte("kept"))
	require.NoError(t, s.Driver().Enqueue(ctx, kept))
	d.server.EmulateUnprocessedItems(s.Config().TableName, func(int, map[string]*server.AttributeValue) bool { return true })
	err = s.Driver().Complete(ctx, []*driver.Envelope{kept})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unprocessed")
	d.server.ClearUnprocessedItems()
	got, err = envelopesOf(s.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Equal(t, []string{"kept"}, payloadsOf(got))
}

func TestParkRequeuePurgeLayout(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	table := s.Config().TableName
	ctx := context.Background()
	a, b := envelope(t, 1, "t", []byte("k"), []byte("a")), envelope(t, 1, "t", []byte("k"), []byte("b"))
	require.NoError(t, s.Driver().Enqueue(ctx, a, b))
	next := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	require.NoError(t, s.Driver().Reschedule(ctx, a, next, "timeout"))
	item := rawItem(t, d, table, "OUTBOX#MESSAGES#0", "0000000000000000001")
	assert.Equal(t, "1", item["Attempts"].(*types.AttributeValueMemberN).Value)
	assert.Equal(t, "timeout", item["LastError"].(*types.AttributeValueMemberS).Value)
	assert.Contains(t, item, "NextAttemptAtUtc")

	require.NoError(t, s.Driver().Park(ctx, a, "too large"))
	assert.Nil(t, rawItem(t, d, table, "OUTBOX#MESSAGES#0", "0000000000000000001"), "a parked message leaves the bucket")
	parked := rawItem(t, d, table, "OUTBOX#PARKED#0", "0000000000000000001")
	require.NotNil(t, parked, "and lands in the parked partition under its sequence number")
	assert.Equal(t, "2", parked["Attempts"].(*types.AttributeValueMemberN).Value)
	assert.Contains(t, parked, "ParkedAtUtc")
	require.NoError(t, s.Driver().Park(ctx, a, "again"), "parking what is gone is skipped")

	n, err := side(s).Requeue(ctx, a.ID, b.ID)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the parked one")
	back := rawItem(t, d, table, "OUTBOX#MESSAGES#0", "0000000000000000001")
	require.NotNil(t, back, "requeued under its original sequence number")
	assert.NotContains(t, back, "Attempts")
	assert.NotContains(t, back, "NextAttemptAtUtc")
	assert.NotContains(t, back, "ParkedAtUtc")
	assert.Equal(t, "too large", back["LastError"].(*types.AttributeValueMemberS).Value)
	got, err := envelopesOf(s.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b"}, payloadsOf(got))
	assert.True(t, got[0].Due(time.Now()))

	require.NoError(t, s.Driver().Park(ctx, got[0], "poison"))
	n, err = side(s).Purge(ctx, a.ID, b.ID)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "one parked, one pending")
	st, err := side(s).Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{0}, st.Pending)
	assert.Zero(t, st.Parked)
}

func TestStatsAndIdleProbe(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2, PendingCountLimit: 5})
	ctx := context.Background()
	k0 := keyForBucket(t, 0, 2)
	var envs []*driver.Envelope
	for i := range 7 {
		e := envelope(t, 2, "t", k0, []byte("x"))
		e.CreatedAt = time.Date(2026, 1, 1, 0, 0, i, 0, time.UTC)
		envs = append(envs, e)
	}
	require.NoError(t, s.Driver().Enqueue(ctx, envs...))
	pending, err := side(s).HasPending(ctx, 1)
	require.NoError(t, err)
	assert.False(t, pending)
	pending, err = side(s).HasPending(ctx, 0)
	require.NoError(t, err)
	assert.True(t, pending)
	reqs, _ := d.proxy.take()
	assert.Equal(t, 2, reqs["Query"], "one query per probe")

	st, err := side(s).Stats(ctx)
	require.NoError(t, err)
	assert.Equal(t, []int{5, 0}, st.Pending, "counted up to the limit")
	assert.Equal(t, 5, st.PendingLimit)
	assert.True(t, st.OldestPending.Equal(envs[0].CreatedAt), "oldest from the bucket head: %v", st.OldestPending)
	reqs, _ = d.proxy.take()
	assert.Equal(t, 5, reqs["Query"], "per bucket its head and its parked count, and the rest of a bucket that has a head")
}

func TestLeaseItems(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 4})
	table := s.Config().TableName
	ctx := context.Background()
	now := time.Date(2026, 5, 6, 7, 8, 9, 123456000, time.UTC)

	ok, err := s.Driver().Claim(ctx, 3, "relay-a", now, now.Add(30*time.Second))
	require.NoError(t, err)
	require.True(t, ok)
	lease := rawItem(t, d, table, "OUTBOX#COORDINATION", "LEASE#0000000003")
	require.NotNil(t, lease)
	assert.Equal(t, "relay-a", lease["Owner"].(*types.AttributeValueMemberS).Value)
	ok, err = s.Driver().Heartbeat(ctx, "relay-a", now, 4, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	rec := rawItem(t, d, table, "OUTBOX#COORDINATION", "RELAY#relay-a")
	assert.Contains(t, rec, "LastSeenUtc")
	assert.Equal(t, &types.AttributeValueMemberN{Value: "4"}, rec["BucketCount"], "the relay's bucket count, a number")

	// A lease item of a larger fleet (bucket 6 of 8) is ignored.
	_, err = d.client.PutItem(ctx, &ddb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "OUTBOX#COORDINATION"}, "SK": &types.AttributeValueMemberS{Value: "LEASE#0000000006"},
		"Owner": &types.AttributeValueMemberS{Value: "old"}, "ExpiresAtUtc": &types.AttributeValueMemberN{Value: "639000000000000000"},
	}})
	require.NoError(t, err)
	coord, err := s.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	require.Len(t, coord.Leases, 1)
	assert.Equal(t, 3, coord.Leases[0].Bucket)
	assert.True(t, coord.Leases[0].ExpiresAt.Equal(now.Add(30*time.Second)))

	// A renewal that would move the expiry backwards is never sent.
	d.proxy.take()
	ok, err = s.Driver().Renew(ctx, coord.Leases[0], now, now.Add(10*time.Second))
	require.NoError(t, err)
	assert.False(t, ok)
	reqs, refused := d.proxy.take()
	assert.Zero(t, reqs["UpdateItem"])
	assert.Zero(t, refused)

	// Stop: stamped, not deleted; a later heartbeat (a restart) clears the stamp.
	require.NoError(t, s.Driver().StopRelay(ctx, "relay-a", now.Add(time.Second)))
	rec = rawItem(t, d, table, "OUTBOX#COORDINATION", "RELAY#relay-a")
	require.NotNil(t, rec)
	assert.Contains(t, rec, "StoppedAtUtc")
	assert.Equal(t, &types.AttributeValueMemberN{Value: "4"}, rec["BucketCount"], "the stop stamp keeps the bucket count")
	ok, err = s.Driver().Heartbeat(ctx, "relay-a", now.Add(500*time.Millisecond), 8, driver.Instance{})
	require.NoError(t, err)
	assert.False(t, ok, "an abandoned heartbeat cannot revive a stopped relay")
	ok, err = s.Driver().Heartbeat(ctx, "relay-a", now.Add(2*time.Second), 8, driver.Instance{})
	require.NoError(t, err)
	assert.True(t, ok)
	rec = rawItem(t, d, table, "OUTBOX#COORDINATION", "RELAY#relay-a")
	assert.NotContains(t, rec, "StoppedAtUtc")
	assert.Equal(t, &types.AttributeValueMemberN{Value: "8"}, rec["BucketCount"])
}

// TestReadRelaysQueriesRelayItemsOnly: ReadRelays is one eventually consistent Query
// whose key condition stops at the relay items, so the lease items beside them in the
// coordination partition are neither read nor paid for, and a record written before
// relays stored their bucket count reads as 0.
func TestReadRelaysQueriesRelayItemsOnly(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 8})
	table := s.Config().TableName
	ctx := context.Background()
	now := time.Date(2026, 5, 6, 7, 8, 9, 123456000, time.UTC)

	for b := range 8 {
		ok, err := s.Driver().Claim(ctx, b, "relay-a", now, now.Add(time.Minute))
		require.NoError(t, err)
		require.True(t, ok)
	}
	for i, id := range []string{"relay-b", "relay-a"} {
		ok, err := s.Driver().Heartbeat(ctx, id, now.Add(time.Duration(i)*time.Second), 8*(i+1), driver.Instance{})
		require.NoError(t, err)
		require.True(t, ok)
	}
	// A record as an earlier version wrote it: no BucketCount.
	old := now.Add(-time.Hour)
	const unixEpochTicks = 621_355_968_000_000_000
	_, err := d.client.PutItem(ctx, &ddb.PutItemInput{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "OUTBOX#COORDINATION"}, "SK": &types.AttributeValueMemberS{Value: "RELAY#relay-old"},
		"LastSeenUtc": &types.AttributeValueMemberN{Value: fmt.Sprint(unixEpochTicks + old.UnixNano()/100)},
	}})
	require.NoError(t, err)
	require.NoError(t, s.Driver().StopRelay(ctx, "relay-b", now.Add(5*time.Second)))

	d.proxy.take()
	relays, err := s.Driver().ReadRelays(ctx)
	require.NoError(t, err)
	reqs, _ := d.proxy.take()
	assert.Equal(t, map[string]int{"Query": 1}, reqs, "one request")
	sent, got := d.proxy.lastExchange(t, "Query")
	assert.NotEqual(t, true, sent["ConsistentRead"], "eventually consistent: half the read units")
	assert.Contains(t, sent["KeyConditionExpression"], "begins_with(")
	assert.Contains(t, fmt.Sprint(sent["ExpressionAttributeValues"]), "RELAY#")
	assert.NotEmpty(t, sent["ProjectionExpression"])
	assert.EqualValues(t, 3, got["Count"], "the relay items and nothing else")
	assert.Len(t, got["Items"], 3)

	want := []driver.RelayRecord{
		{ID: "relay-a", LastSeen: now.Add(time.Second), BucketCount: 16},
		{ID: "relay-b", LastSeen: now.Add(5 * time.Second), StoppedAt: now.Add(5 * time.Second), BucketCount: 8},
		{ID: "relay-old", LastSeen: old},
	}
	require.Len(t, relays, len(want))
	for i, r := range relays {
		assert.Equal(t, want[i].ID, r.ID)
		assert.True(t, want[i].LastSeen.Equal(r.LastSeen), "%s: LastSeen %v, want %v", r.ID, r.LastSeen, want[i].LastSeen)
		assert.True(t, want[i].StoppedAt.Equal(r.StoppedAt), "%s: StoppedAt %v, want %v", r.ID, r.StoppedAt, want[i].StoppedAt)
		assert.Equal(t, want[i].BucketCount, r.BucketCount, r.ID)
	}
	coord, err := s.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	assert.Equal(t, relays, coord.Relays, "the same records as the consistent read")
}

func TestCreateIfNotExists(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	opts := dynamostore.Config{TableName: uniqueTable(t), PartitionKeyAttributeName: "pk", SortKeyAttributeName: "sk"}

	in, err := dynamostore.CreateTableInput(opts)
	require.NoError(t, err)
	assert.Equal(t, types.BillingModePayPerRequest, in.BillingMode)
	assert.Equal(t, "pk", aws.ToString(in.KeySchema[0].AttributeName))
	assert.Equal(t, types.KeyTypeHash, in.KeySchema[0].KeyType)
	assert.Equal(t, types.KeyTypeRange, in.KeySchema[1].KeyType)
	_, err = dynamostore.CreateTableInput(dynamostore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	// Several processes at once (the proxy serialises requests, as the API server
	// cannot create tables concurrently).
	d.proxy.mu.Lock()
	d.proxy.serial = true
	d.proxy.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, 5)
	for i := range errs {
		wg.Go(func() { errs[i] = dynamostore.CreateIfNotExists(ctx, d.client, opts) })
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	reqs, _ := d.proxy.take()
	assert.GreaterOrEqual(t, reqs["CreateTable"], 1)
	require.NoError(t, dynamostore.CreateIfNotExists(ctx, d.client, opts), "an existing table is fine")
	reqs, _ = d.proxy.take()
	assert.Zero(t, reqs["CreateTable"], "an existing table is not created again")

	// A table with another key schema is refused.
	err = dynamostore.CreateIfNotExists(ctx, d.client, dynamostore.Config{TableName: opts.TableName})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	// A store on a missing table says so.
	s, err := dynamostore.New(d.client, dynamostore.Config{TableName: "missing-table"})
	require.NoError(t, err)
	_, err = s.Driver().Fetch(ctx, 0, 1)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "missing-table")
}

func TestContextAndClose(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Driver().Enqueue(ctx, envelope(t, 1, "t", nil, nil))
	require.True(t, errors.Is(err, context.Canceled) && err == context.Canceled, "context errors come back unwrapped: %v", err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "closing twice is a no-op")
	_, err = s.Driver().Fetch(context.Background(), 0, 1)
	require.ErrorIs(t, err, outbox.ErrClosed)
	var c dynamostore.Client
	require.True(t, s.As(&c))
	var raw *ddb.Client
	require.True(t, s.As(&raw))
	assert.Same(t, d.client, raw)
}

func TestSampleBacklogOnlyByTheOwnerOfBucketZero(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	a := d.newStore(t, dynamostore.Config{BucketCount: 2})
	b, err := dynamostore.New(d.client, a.Config())
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, a.Driver().Enqueue(ctx, envelope(t, 2, "t", keyForBucket(t, 1, 2), []byte("x"))))
	now := time.Now().UTC().Truncate(time.Microsecond)

	_, sampled, err := side(a).SampleBacklog(ctx)
	require.NoError(t, err)
	assert.False(t, sampled, "no lease, no sample")
	ok, err := a.Driver().Claim(ctx, 0, "relay-a", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = b.Driver().Claim(ctx, 1, "relay-b", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	d.proxy.take()

	_, sampled, err = side(b).SampleBacklog(ctx)
	require.NoError(t, err)
	assert.False(t, sampled)
	reqs, _ := d.proxy.take()
	assert.Empty(t, reqs, "a relay without bucket zero sends nothing")

	st, sampled, err := side(a).SampleBacklog(ctx)
	require.NoError(t, err)
	require.True(t, sampled)
	assert.Equal(t, []int{0, 1}, st.Pending)

	ok, err = a.Driver().Release(ctx, driver.Lease{Bucket: 0, Owner: "relay-a", ExpiresAt: now.Add(time.Minute)})
	require.NoError(t, err)
	require.True(t, ok)
	_, sampled, err = side(a).SampleBacklog(ctx)
	require.NoError(t, err)
	assert.False(t, sampled, "released, no longer sampling")
}
