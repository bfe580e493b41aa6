package tests

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// TestMalformedItemsAreParkedAtOnce: items a foreign writer put without a required
// attribute are parked on the first fetch, with a cause naming the attribute, and the
// rest of their key goes out in order; nothing is published for them.
func TestMalformedItemsAreParkedAtOnce(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	table := s.Config().TableName
	ctx := context.Background()
	var envs []*driver.Envelope
	for _, p := range []string{"1", "no-topic", "no-created", "no-id", "5"} {
		envs = append(envs, envelope(t, 1, "t", []byte("k"), []byte(p)))
	}
	require.NoError(t, s.Driver().Enqueue(ctx, envs...))
	// Rewrite three items without one required attribute each.
	for seq, attr := range map[string]string{"0000000000000000002": "Topic", "0000000000000000003": "CreatedAtUtc", "0000000000000000004": "MessageId"} {
		item := rawItem(t, d, table, "OUTBOX#MESSAGES#0", seq)
		delete(item, attr)
		_, err := d.client.PutItem(ctx, &ddb.PutItemInput{TableName: aws.String(table), Item: item})
		require.NoError(t, err)
	}

	rec := outboxtest.NewRecorder()
	disp, err := relay.New(s, rec, relay.Config{
		RelayID: "relay-m", BucketCount: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	_, err = disp.RunOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"1", "5"}, payloadsOf(rec.Messages()), "only the well-formed messages go out, in order")

	parked, err := side(s).List(ctx, driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Len(t, parked, 3)
	causes := map[int64]string{}
	for _, p := range parked {
		causes[p.Seq] = p.LastError
		assert.Zero(t, p.Attempts, "parked at once, without a publish attempt")
	}
	assert.Contains(t, causes[2], "Topic")
	assert.Contains(t, causes[3], "CreatedAtUtc")
	assert.Contains(t, causes[4], "MessageId")
	assert.Equal(t, uuid.Nil, parked[2].ID, "an item without an ID is listed with a nil ID")
	left, err := envelopesOf(s.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	assert.Empty(t, left)
}

// deleteOnRefusal deletes the relay record right after a refused UpdateItem, once
// armed: a peer's cleanup landing between the two writes of a stop.
type deleteOnRefusal struct {
	dynamostore.Client
	armed atomic.Bool
	key   map[string]types.AttributeValue
	table string
}

func (c *deleteOnRefusal) UpdateItem(ctx context.Context, in *ddb.UpdateItemInput, opts ...func(*ddb.Options)) (*ddb.UpdateItemOutput, error) {
	out, err := c.Client.UpdateItem(ctx, in, opts...)
	var ccf *types.ConditionalCheckFailedException
	if !asCCF(err, &ccf) {
		return out, err
	}
	if c.armed.CompareAndSwap(true, false) {
		if _, derr := c.Client.DeleteItem(ctx, &ddb.DeleteItemInput{TableName: aws.String(c.table), Key: c.key}); derr != nil {
			return out, derr
		}
	}
	return out, err
}

// TestStopRelayNeverLeavesARecordWithoutLastSeen: a stop that finds a later
// heartbeat stamps the stop alone; if the record was deleted in between, the stop
// writes a whole record (with LastSeenUtc) instead of one the cleanup could never
// delete.
func TestStopRelayNeverLeavesARecordWithoutLastSeen(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	table := s.Config().TableName
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)

	// A later heartbeat: the stop is stamped alone, LastSeenUtc is kept.
	ok, err := s.Driver().Heartbeat(ctx, "relay-a", now.Add(time.Second), 1, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, s.Driver().StopRelay(ctx, "relay-a", now))
	c, err := s.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	require.Len(t, c.Relays, 1)
	assert.True(t, c.Relays[0].LastSeen.Equal(now.Add(time.Second)))
	assert.True(t, c.Relays[0].StoppedAt.Equal(now))

	// The record deleted between the stop's two writes.
	ok, err = s.Driver().Heartbeat(ctx, "relay-b", now.Add(time.Second), 1, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	wrapped := &deleteOnRefusal{Client: d.client, table: table, key: map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "OUTBOX#COORDINATION"}, "SK": &types.AttributeValueMemberS{Value: "RELAY#relay-b"},
	}}
	wrapped.armed.Store(true)
	stopper, err := dynamostore.New(wrapped, s.Config())
	require.NoError(t, err)
	require.NoError(t, stopper.Driver().StopRelay(ctx, "relay-b", now))
	item := rawItem(t, d, table, "OUTBOX#COORDINATION", "RELAY#relay-b")
	if item != nil {
		assert.Contains(t, item, "LastSeenUtc", "a relay record without LastSeenUtc can never be deleted")
		c, err := s.Driver().ReadCoordination(ctx)
		require.NoError(t, err)
		for _, r := range c.Relays {
			if r.ID == "relay-b" {
				deleted, err := s.Driver().DeleteRelay(ctx, "relay-b", r.LastSeen)
				require.NoError(t, err)
				assert.True(t, deleted, "the cleanup can delete the record the stop left")
			}
		}
	}
}

func asCCF(err error, target **types.ConditionalCheckFailedException) bool {
	return errors.As(err, target)
}
