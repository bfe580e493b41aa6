package tests

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// inboxStores remembers the client and table of each store the harness made.
type inboxStores struct {
	mu sync.Mutex
	m  map[outboxtest.Store]inboxTable
}

type inboxTable struct {
	client *ddb.Client
	table  string
}

func (s *inboxStores) get(st outboxtest.Store) inboxTable {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[st]
}

// appItem is the application's own effect: an item in the same table, one per
// applied message, under the key's partition.
func appItem(table, key string) types.TransactWriteItem {
	return types.TransactWriteItem{Put: &types.Put{
		TableName: aws.String(table),
		Item: map[string]types.AttributeValue{
			"PK": &types.AttributeValueMemberS{Value: "APP#" + key},
			"SK": &types.AttributeValueMemberS{Value: uuid.NewString()},
		},
	}}
}

func countApp(t *testing.T, tb inboxTable, key string) int {
	t.Helper()
	out, err := tb.client.Query(context.Background(), &ddb.QueryInput{
		TableName:                 aws.String(tb.table),
		KeyConditionExpression:    aws.String("PK = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "APP#" + key}},
		ConsistentRead:            aws.Bool(true),
		Select:                    types.SelectCount,
	})
	require.NoError(t, err)
	return int(out.Count)
}

func TestInboxConformance(t *testing.T) {
	stores := &inboxStores{m: map[outboxtest.Store]inboxTable{}}
	outboxtest.RunInboxTests(t, outboxtest.InboxHarness{
		New: func(t *testing.T) outboxtest.Store {
			db := newTestDB(t)
			table := uniqueTable(t)
			st := db.newStore(t, dynamostore.Config{TableName: table, BucketCount: 1})
			stores.mu.Lock()
			stores.m[st] = inboxTable{db.client, table}
			stores.mu.Unlock()
			return st
		},
		Effect: func(ctx context.Context, st outboxtest.Store, key string) error {
			return dynamostore.AddItems(ctx, appItem(stores.get(st).table, key))
		},
		Effects: func(t *testing.T, st outboxtest.Store, key string) int {
			return countApp(t, stores.get(st), key)
		},
	})
}

// TestInboxKeyRecordedAtCommit: a key that another unit records after this unit's
// check (a racing consumer) cancels this unit's transaction at commit, wherever the
// key's item sits among the unit's items, and the inbox reports a duplicate; none of
// the unit's items is written.
func TestInboxKeyRecordedAtCommit(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	table := uniqueTable(t)
	st := db.newStore(t, dynamostore.Config{TableName: table, BucketCount: 1})
	in, err := inbox.New(st, inbox.Config{Consumer: "billing", Now: func() time.Time { return time.Unix(1_900_000_000, 0) }})
	require.NoError(t, err)
	msg := &outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("pay-1")}}}
	racer := map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "OUTBOX#INBOX#pay-1"},
		"SK": &types.AttributeValueMemberS{Value: "CONSUMER#billing"},
	}

	var res inbox.Result
	err = st.Transact(ctx, func(ctx context.Context) error {
		// An application item first, so the key's item is not the first reason.
		if err := dynamostore.AddItems(ctx, appItem(table, "before")); err != nil {
			return err
		}
		var err error
		res, err = in.Process(ctx, msg, func(ctx context.Context) error {
			if err := dynamostore.AddItems(ctx, appItem(table, "pay-1")); err != nil {
				return err
			}
			// The racing consumer commits the key now.
			_, err := db.client.PutItem(ctx, &ddb.PutItemInput{TableName: aws.String(table), Item: racer})
			return err
		})
		return err
	})
	_, cancelled := errors.AsType[*types.TransactionCanceledException](err)
	require.True(t, cancelled, "a joined Process leaves the outer unit to commit, which DynamoDB cancels: %v", err)
	require.False(t, res.Duplicate, "the joined Process could not know before the outer commit")

	res, err = in.Process(ctx, msg, func(ctx context.Context) error {
		return dynamostore.AddItems(ctx, appItem(table, "pay-1"))
	})
	require.NoError(t, err)
	require.True(t, res.Duplicate)
	require.Zero(t, countApp(t, inboxTable{db.client, table}, "pay-1"))
	require.Zero(t, countApp(t, inboxTable{db.client, table}, "before"))

	// Commit-time detection on its own unit: the key appears between the check and
	// the commit.
	msg2 := &outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("pay-2")}}}
	racer["PK"] = &types.AttributeValueMemberS{Value: "OUTBOX#INBOX#pay-2"}
	res, err = in.Process(ctx, msg2, func(ctx context.Context) error {
		if err := dynamostore.AddItems(ctx, appItem(table, "pay-2")); err != nil {
			return err
		}
		_, err := db.client.PutItem(ctx, &ddb.PutItemInput{TableName: aws.String(table), Item: racer})
		return err
	})
	require.NoError(t, err)
	require.True(t, res.Duplicate, "the key's cancellation reason is a duplicate")
	require.Zero(t, countApp(t, inboxTable{db.client, table}, "pay-2"), "nothing of the unit was written")
}

// TestInboxItemLayout: the key's item carries the consumer, the key and the TTL
// attribute in Unix seconds.
func TestInboxItemLayout(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	table := uniqueTable(t)
	st := db.newStore(t, dynamostore.Config{TableName: table, BucketCount: 1, KeyPrefix: "SHOP"})
	now := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	in, err := inbox.New(st, inbox.Config{Consumer: "billing", Retention: time.Hour, Now: func() time.Time { return now }})
	require.NoError(t, err)
	msg := &outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("pay-1")}}}
	_, err = in.Process(ctx, msg, func(context.Context) error { return nil })
	require.NoError(t, err)

	out, err := db.client.Query(ctx, &ddb.QueryInput{
		TableName:                 aws.String(table),
		KeyConditionExpression:    aws.String("PK = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: "SHOP#INBOX#pay-1"}},
		ConsistentRead:            aws.Bool(true),
	})
	require.NoError(t, err)
	require.Len(t, out.Items, 1)
	item := out.Items[0]
	require.Equal(t, &types.AttributeValueMemberS{Value: "CONSUMER#billing"}, item["SK"])
	require.Equal(t, &types.AttributeValueMemberS{Value: "billing"}, item["Consumer"])
	require.Equal(t, &types.AttributeValueMemberS{Value: "pay-1"}, item["InboxKey"])
	require.Equal(t, &types.AttributeValueMemberN{Value: strconv.FormatInt(now.Add(time.Hour).Unix(), 10)}, item[dynamostore.InboxTTLAttributeName])

	n, err := in.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "DynamoDB's TTL removes the keys")
}

// TestInboxRacingUnitsReadAsDuplicates: units racing on one key all pass the check
// before their function and commit together; every loser's cancellation is read as a
// duplicate, none as an error.
func TestInboxRacingUnitsReadAsDuplicates(t *testing.T) {
	ctx := context.Background()
	db := newTestDB(t)
	table := uniqueTable(t)
	st := db.newStore(t, dynamostore.Config{TableName: table, BucketCount: 1})
	const racers = 5
	var entered sync.WaitGroup
	entered.Add(racers)
	type outcome struct {
		res inbox.Result
		err error
	}
	out := make(chan outcome, racers)
	for range racers {
		in, err := inbox.New(st, inbox.Config{Consumer: "billing"})
		require.NoError(t, err)
		go func() {
			msg := &outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("pay-race")}}}
			res, err := in.Process(ctx, msg, func(ctx context.Context) error {
				if err := dynamostore.AddItems(ctx, appItem(table, "pay-race")); err != nil {
					return err
				}
				entered.Done()
				entered.Wait() // every racer has passed the check
				return nil
			})
			out <- outcome{res, err}
		}()
	}
	dups := 0
	for range racers {
		o := <-out
		require.NoError(t, o.err, "a racing unit's cancellation is a duplicate, not an error")
		if o.res.Duplicate {
			dups++
		}
	}
	require.Equal(t, racers-1, dups)
	require.Equal(t, 1, countApp(t, inboxTable{db.client, table}, "pay-race"))
}
