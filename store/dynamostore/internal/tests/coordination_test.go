package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

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

// abandoningClient gives up on the next heartbeat once armed: the caller gets a
// deadline error and the request is kept, to land whenever the test sends it on.
type abandoningClient struct {
	dynamostore.Client
	mu    sync.Mutex
	armed bool
	held  *ddb.PutItemInput
}

func (c *abandoningClient) PutItem(ctx context.Context, in *ddb.PutItemInput, opts ...func(*ddb.Options)) (*ddb.PutItemOutput, error) {
	c.mu.Lock()
	if c.armed && strings.HasPrefix(attrS(in.Item["SK"]), "RELAY#") {
		c.armed, c.held = false, in
		c.mu.Unlock()
		return nil, context.DeadlineExceeded
	}
	c.mu.Unlock()
	return c.Client.PutItem(ctx, in, opts...)
}

// TestAbandonedHeartbeatNeverClearsAStop: a heartbeat the relay gave up on that lands
// after the relay stamped itself stopped is refused, also when the clock was set back
// between the two (the heartbeat is then dated after the stop); a relay that runs
// again under the same ID clears the stamp with its first heartbeat dated after the
// record.
func TestAbandonedHeartbeatNeverClearsAStop(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		stop time.Duration // after the last heartbeat that landed
	}{
		{"in order", 2 * time.Second},
		{"clock set back", -10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newTestDB(t)
			table := d.newStore(t, dynamostore.Config{BucketCount: 1}).Config()
			client := &abandoningClient{Client: d.client}
			s, err := dynamostore.New(client, table)
			require.NoError(t, err)
			ctx := context.Background()
			base := time.Now().UTC().Truncate(time.Microsecond)

			ok, err := s.Driver().Heartbeat(ctx, "relay-a", base, 1, driver.Instance{})
			require.NoError(t, err)
			require.True(t, ok)
			client.mu.Lock()
			client.armed = true
			client.mu.Unlock()
			_, err = s.Driver().Heartbeat(ctx, "relay-a", base.Add(time.Second), 1, driver.Instance{})
			require.ErrorIs(t, err, context.DeadlineExceeded)
			client.mu.Lock()
			abandoned := client.held
			client.mu.Unlock()
			require.NotNil(t, abandoned)

			stoppedAt := base.Add(tc.stop)
			require.NoError(t, s.Driver().StopRelay(ctx, "relay-a", stoppedAt))
			_, err = d.client.PutItem(ctx, abandoned)
			_, refused := errors.AsType[*types.ConditionalCheckFailedException](err)
			assert.True(t, refused, "the abandoned heartbeat lands after the stop and is refused: %v", err)

			view, err := s.Driver().ReadCoordination(ctx)
			require.NoError(t, err)
			require.Len(t, view.Relays, 1)
			r := view.Relays[0]
			assert.True(t, r.Stopped(), "the stop stamp survives")
			assert.True(t, r.StoppedAt.Equal(stoppedAt), "StoppedAt %v, want %v", r.StoppedAt, stoppedAt)
			assert.False(t, r.LastSeen.Before(base.Add(time.Second)), "the record is dated no earlier than the last heartbeat sent")

			// The relay runs again, in another process: its heartbeats land once they
			// are dated after the record, and clear the stamp.
			again, err := dynamostore.New(d.client, table)
			require.NoError(t, err)
			ok, err = again.Driver().Heartbeat(ctx, "relay-a", r.LastSeen, 1, driver.Instance{})
			require.NoError(t, err)
			assert.False(t, ok, "a heartbeat not after the record is refused")
			ok, err = again.Driver().Heartbeat(ctx, "relay-a", r.LastSeen.Add(time.Millisecond), 1, driver.Instance{})
			require.NoError(t, err)
			assert.True(t, ok)
			view, err = again.Driver().ReadCoordination(ctx)
			require.NoError(t, err)
			require.Len(t, view.Relays, 1)
			assert.False(t, view.Relays[0].Stopped(), "a relay that runs again is counted again")
		})
	}
}

// putCoordinationItem writes an item into the coordination partition as another
// writer would, with attrs beside its keys.
func putCoordinationItem(t *testing.T, d *testDB, table, sk string, attrs map[string]types.AttributeValue) {
	t.Helper()
	item := map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "OUTBOX#COORDINATION"}, "SK": &types.AttributeValueMemberS{Value: sk},
	}
	for k, v := range attrs {
		item[k] = v
	}
	_, err := d.client.PutItem(context.Background(), &ddb.PutItemInput{TableName: aws.String(table), Item: item})
	require.NoError(t, err)
}

// TestRelayRecordsWithoutLastSeenAreDeletedOnce: relay records an older version left
// without LastSeenUtc are deleted by the first cleanup, with no refused write, and
// cost nothing in the rounds after.
func TestRelayRecordsWithoutLastSeenAreDeletedOnce(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	putCoordinationItem(t, d, table, "RELAY#old-bare", nil)
	putCoordinationItem(t, d, table, "RELAY#old-stopped", map[string]types.AttributeValue{
		"StoppedAtUtc": &types.AttributeValueMemberN{Value: fmt.Sprint(639_000_000_000_000_000)},
	})
	d.proxy.take()

	disp, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{
		RelayID: "relay-a", BucketCount: 2, PollInterval: 20 * time.Millisecond,
		LeaseRenewInterval: 100 * time.Millisecond, LeaseDuration: 2 * time.Second, BacklogInterval: -1,
		// Store calls may take a lease's time on a busy machine: a round that times out
		// does not get to the cleanup.
		StoreTimeout: 2 * time.Second,
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, disp.Start(context.Background()))
	t.Cleanup(func() { _ = disp.Stop(context.Background()) })
	require.Eventually(t, func() bool {
		return rawItem(t, d, table, "OUTBOX#COORDINATION", "RELAY#old-bare") == nil &&
			rawItem(t, d, table, "OUTBOX#COORDINATION", "RELAY#old-stopped") == nil
	}, time.Minute, 10*time.Millisecond, "both records deleted")
	// Rounds after the cleanup delete nothing more.
	rounds := disp.Stats().Rounds
	require.Eventually(t, func() bool { return disp.Stats().Rounds >= rounds+3 }, time.Minute, 10*time.Millisecond)
	reqs, refusals := d.proxy.takeRefusals()
	assert.Empty(t, refusals, "no refused write")
	assert.Equal(t, 2, reqs["DeleteItem"], "one delete per record")
}

// syncBuffer is a log destination that tests can read while a relay writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestMalformedCoordinationItemsAreSkipped: coordination items that cannot be read
// (lease sort keys that are not LEASE# and ten digits, a relay item without an id,
// attributes of the wrong type) are left out of both reads and reported once each,
// while everything else reads as usual and a relay on the table takes its buckets.
func TestMalformedCoordinationItemsAreSkipped(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	var logs syncBuffer
	cfg := dynamostore.Config{BucketCount: 2, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	s := d.newStore(t, cfg)
	table := s.Config().TableName
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)

	ok, err := s.Driver().Claim(ctx, 1, "relay-a", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = s.Driver().Heartbeat(ctx, "relay-a", now, 2, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	malformed := []string{"LEASE#abc", "LEASE#0", "LEASE#-000000001", "LEASE#0000000000", "RELAY#", "RELAY#relay-b"}
	putCoordinationItem(t, d, table, "LEASE#abc", map[string]types.AttributeValue{"Owner": &types.AttributeValueMemberS{Value: "x"}})
	putCoordinationItem(t, d, table, "LEASE#0", map[string]types.AttributeValue{"Owner": &types.AttributeValueMemberS{Value: "x"}})
	putCoordinationItem(t, d, table, "LEASE#-000000001", nil)
	putCoordinationItem(t, d, table, "LEASE#0000000000", map[string]types.AttributeValue{
		"Owner": &types.AttributeValueMemberS{Value: "x"}, "ExpiresAtUtc": &types.AttributeValueMemberS{Value: "soon"},
	})
	putCoordinationItem(t, d, table, "RELAY#", map[string]types.AttributeValue{
		"LastSeenUtc": &types.AttributeValueMemberN{Value: fmt.Sprint(639_000_000_000_000_000)},
	})
	putCoordinationItem(t, d, table, "RELAY#relay-b", map[string]types.AttributeValue{
		"LastSeenUtc": &types.AttributeValueMemberS{Value: "yesterday"},
	})

	for range 3 {
		view, err := s.Driver().ReadCoordination(ctx)
		require.NoError(t, err)
		require.Len(t, view.Leases, 1)
		l := view.Leases[0]
		assert.Equal(t, 1, l.Bucket)
		assert.Equal(t, "relay-a", l.Owner)
		assert.True(t, l.ExpiresAt.Equal(now.Add(time.Minute)))
		require.Len(t, view.Relays, 1)
		assert.Equal(t, "relay-a", view.Relays[0].ID)
		relays, err := s.Driver().ReadRelays(ctx)
		require.NoError(t, err)
		require.Len(t, relays, 1)
		assert.Equal(t, "relay-a", relays[0].ID)
	}
	out := logs.String()
	for _, sk := range malformed {
		assert.Equal(t, 1, strings.Count(out, "sort_key="+sk+" "), "%s is reported once:\n%s", sk, out)
	}
	assert.Equal(t, len(malformed), strings.Count(out, "level=WARN"), out)

	// A relay on the table coordinates as usual and takes both buckets (relay-a's
	// lease released first, as its stop would), bucket 0 by taking over the lease
	// item it cannot read.
	released, err := s.Driver().Release(ctx, driver.Lease{Bucket: 1, Owner: "relay-a", ExpiresAt: now.Add(time.Minute)})
	require.NoError(t, err)
	require.True(t, released)
	other, err := dynamostore.New(d.client, s.Config())
	require.NoError(t, err)
	disp, err := relay.New(other, outboxtest.NewRecorder(), relay.Config{
		RelayID: "relay-c", BucketCount: 2, PollInterval: 20 * time.Millisecond,
		LeaseRenewInterval: 100 * time.Millisecond, LeaseDuration: 2 * time.Second, BacklogInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	d.proxy.take()
	require.NoError(t, disp.Start(ctx))
	t.Cleanup(func() { _ = disp.Stop(context.Background()) })
	require.Eventually(t, func() bool { return len(disp.Owned()) == 2 }, 30*time.Second, 10*time.Millisecond,
		"a malformed coordination item does not stop the relay's rounds")
	_, refusals := d.proxy.takeRefusals()
	assert.Empty(t, refusals, "the unreadable lease is taken over without a refused claim")
	lease := rawItem(t, d, table, "OUTBOX#COORDINATION", "LEASE#0000000000")
	assert.Equal(t, &types.AttributeValueMemberS{Value: "relay-c"}, lease["Owner"])
	assert.IsType(t, &types.AttributeValueMemberN{}, lease["ExpiresAtUtc"], "the claim repaired the item")
}
