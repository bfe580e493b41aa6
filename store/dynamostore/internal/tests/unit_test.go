package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/memstore"
)

// orderPut is an application item: an order, conditional on not existing yet when
// cond is set.
func orderPut(table, id string, cond bool) types.TransactWriteItem {
	p := &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
		"PK": &types.AttributeValueMemberS{Value: "ORDER#" + id}, "SK": &types.AttributeValueMemberS{Value: "ORDER"},
	}}
	if cond {
		p.ConditionExpression = aws.String("attribute_not_exists(PK)")
	}
	return types.TransactWriteItem{Put: p}
}

// blobPuts returns n application Puts carrying size bytes each.
func blobPuts(table string, n, size int) []types.TransactWriteItem {
	out := make([]types.TransactWriteItem, n)
	for i := range out {
		out[i] = types.TransactWriteItem{Put: &types.Put{TableName: aws.String(table), Item: map[string]types.AttributeValue{
			"PK":   &types.AttributeValueMemberS{Value: "APP#" + strings.Repeat("x", i%7)},
			"SK":   &types.AttributeValueMemberS{Value: strings.Repeat("y", i+1)},
			"Blob": &types.AttributeValueMemberB{Value: make([]byte, size)},
		}}}
	}
	return out
}

func newSender(t *testing.T, st outbox.Store, mode outbox.WriteMode) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(st, outbox.SenderConfig{Mode: mode})
	require.NoError(t, err)
	return c
}

func order(key, payload string) outbox.Message {
	return outbox.Message{Topic: "orders", Key: []byte(key), Payload: []byte(payload)}
}

// stored returns the payloads of every pending message, bucket after bucket.
func stored(t *testing.T, s *dynamostore.Store) []string {
	t.Helper()
	var out []string
	for b := range s.Driver().BucketCount() {
		got, err := envelopesOf(s.Driver().Fetch(context.Background(), b, 1000))
		require.NoError(t, err)
		out = append(out, payloadsOf(got)...)
	}
	return out
}

func TestTransactWritesAppItemsAndMessagesInOneRequest(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	ctx := context.Background()
	send := newSender(t, s, outbox.Transactional)

	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		if err := dynamostore.AddItems(ctx, orderPut(table, "1", true)); err != nil {
			return err
		}
		if err := send.Send(ctx, order("order-1", "created")); err != nil {
			return err
		}
		return send.Send(ctx, order("order-1", "paid"))
	}))
	reqs, _ := d.proxy.take()
	assert.Equal(t, map[string]int{"UpdateItem": 1, "TransactWriteItems": 1}, reqs,
		"one sequence reservation, then the order and both messages in one transaction")
	assert.NotNil(t, rawItem(t, d, table, "ORDER#1", "ORDER"))
	assert.Equal(t, []string{"created", "paid"}, stored(t, s), "in send order")

	// The order exists: its condition fails and cancels the whole transaction.
	err := s.Transact(ctx, func(ctx context.Context) error {
		if err := send.Send(ctx, order("order-1", "created again")); err != nil {
			return err
		}
		return dynamostore.AddItems(ctx, orderPut(table, "1", true), orderPut(table, "2", false))
	})
	tce, ok := errors.AsType[*types.TransactionCanceledException](err)
	require.True(t, ok, "the SDK's exception is reachable with errors.As: %v", err)
	require.Len(t, tce.CancellationReasons, 3, "application items first, in the order added, then the message")
	assert.Equal(t, "ConditionalCheckFailed", aws.ToString(tce.CancellationReasons[0].Code))
	assert.Nil(t, rawItem(t, d, table, "ORDER#2", "ORDER"), "the other application item is not written")
	assert.Equal(t, []string{"created", "paid"}, stored(t, s), "the message is not written")

	// Application items alone are a unit too.
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		return dynamostore.AddItems(ctx, orderPut(table, "3", true))
	}))
	assert.NotNil(t, rawItem(t, d, table, "ORDER#3", "ORDER"))
}

func TestTransactWithOneMessageUsesPutItem(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	send := newSender(t, s, outbox.Transactional)
	require.NoError(t, s.Transact(context.Background(), func(ctx context.Context) error {
		return send.Send(ctx, order("k", "only"))
	}))
	reqs, _ := d.proxy.take()
	assert.Equal(t, map[string]int{"UpdateItem": 1, "PutItem": 1}, reqs, "a conditional PutItem instead of a transaction")
	assert.Equal(t, []string{"only"}, stored(t, s))
}

func TestTransactIsSafeUnderSDKRetries(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	send := newSender(t, s, outbox.Transactional)

	// The first attempt is applied and its response lost; the SDK's retry fails the
	// conditions (the order, and the messages' own puts), and the store finds its
	// messages under the sequence numbers it reserved for this commit.
	d.proxy.loseNext("TransactWriteItems", 1)
	require.NoError(t, s.Transact(context.Background(), func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "1", true)))
		require.NoError(t, send.Send(ctx, order("k", "a")))
		return send.Send(ctx, order("k", "b"))
	}))
	reqs, _ := d.proxy.take()
	assert.Equal(t, 2, reqs["TransactWriteItems"], "the SDK retried")
	assert.Equal(t, []string{"a", "b"}, stored(t, s), "each message stored once")
}

// An Immediate send made inside a unit of work joins it, and rolls back with it.
func TestTransactImmediateSendRollsBack(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	send := newSender(t, s, outbox.Immediate)
	boom := errors.New("payment declined")
	err := s.Transact(context.Background(), func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "1", false)))
		require.NoError(t, send.Send(ctx, order("k", "created")))
		return boom
	})
	require.ErrorIs(t, err, boom, "fn's error is returned as is")
	reqs, _ := d.proxy.take()
	assert.Empty(t, reqs, "a rolled-back unit makes no request, not even a sequence reservation")
	assert.Nil(t, rawItem(t, d, table, "ORDER#1", "ORDER"))
	assert.Empty(t, stored(t, s))
}

func TestTransactPanicRollsBackQuietly(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	send := newSender(t, s, outbox.Transactional)
	recovered := func() (r any) {
		defer func() { r = recover() }()
		_ = s.Transact(context.Background(), func(ctx context.Context) error {
			require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "1", false)))
			require.NoError(t, send.Send(ctx, order("k", "created")))
			panic("handler bug")
		})
		return nil
	}()
	require.Equal(t, "handler bug", recovered, "the panic goes on")
	reqs, _ := d.proxy.take()
	assert.Empty(t, reqs)
	assert.Nil(t, rawItem(t, d, table, "ORDER#1", "ORDER"))
	assert.Empty(t, stored(t, s))
}

// TestNestedTransactIsASavepoint: a nested Transact whose function fails or panics
// drops the items it added and the messages it sent; the outer unit goes on and
// commits the rest, with the items and messages of a nested unit that succeeded, in
// one request.
func TestNestedTransactIsASavepoint(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	ctx := context.Background()
	send := newSender(t, s, outbox.Transactional)

	boom := errors.New("inner failed")
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "1", true)))
		require.NoError(t, send.Send(ctx, order("k", "outer")))

		err := s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "2", true), orderPut(table, "3", true)))
			require.NoError(t, send.Send(ctx, order("k", "failed")))
			return boom
		})
		require.ErrorIs(t, err, boom, "the nested unit's error is returned as is")

		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "4", true)))
				require.NoError(t, send.Send(ctx, order("k", "panicked")))
				panic("handler bug")
			})
			return nil
		}()
		require.Equal(t, "handler bug", recovered)

		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "5", true)))
			return send.Send(ctx, order("k", "kept"))
		}))

		// The dropped items no longer count: the unit takes 100 items in all again.
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "6", true)))
		reqs, _ := d.proxy.take()
		require.Empty(t, reqs, "nothing is sent before the outer unit commits")
		return send.Send(ctx, order("k", "last"))
	}))
	reqs, _ := d.proxy.take()
	assert.Equal(t, map[string]int{"UpdateItem": 1, "TransactWriteItems": 1}, reqs, "one reservation, one transaction")
	for _, id := range []string{"1", "5", "6"} {
		assert.NotNil(t, rawItem(t, d, table, "ORDER#"+id, "ORDER"), "order %s is written", id)
	}
	for _, id := range []string{"2", "3", "4"} {
		assert.Nil(t, rawItem(t, d, table, "ORDER#"+id, "ORDER"), "order %s was dropped with its nested unit", id)
	}
	assert.Equal(t, []string{"outer", "kept", "last"}, stored(t, s), "in send order, without the dropped messages")

	// The limits count what the unit keeps: a failed nested unit's items are gone.
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, blobPuts(table, 60, 1)...))
		require.ErrorIs(t, s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, dynamostore.AddItems(ctx, blobPuts(table, 40, 1)...))
			return boom
		}), boom)
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "7", true)))
		for i := range 39 {
			require.NoError(t, send.Send(ctx, order("k", fmt.Sprint("fill-", i))))
		}
		return nil
	}), "60 items, 1 item and 39 messages fit in one transaction")
	assert.NotNil(t, rawItem(t, d, table, "ORDER#7", "ORDER"))
	assert.Len(t, stored(t, s), 3+39)
}

// TestNestedTransactJoins: a nested Transact that succeeds keeps its items and
// messages in the outer unit: they roll back and commit with it.
func TestNestedTransactJoins(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	other := d.newStore(t, dynamostore.Config{BucketCount: 2}) // another table
	ctx := context.Background()
	send := newSender(t, s, outbox.Transactional)

	// The inner unit's items and messages roll back with the outer unit.
	boom := errors.New("outer failed")
	err := s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "1", false)))
			return send.Send(ctx, order("k", "inner"))
		}))
		reqs, _ := d.proxy.take()
		require.Empty(t, reqs, "the inner unit does not commit on its own")
		return boom
	})
	require.ErrorIs(t, err, boom)
	assert.Nil(t, rawItem(t, d, table, "ORDER#1", "ORDER"))
	assert.Empty(t, stored(t, s))

	// Released, they commit with the outer unit, in one request, even with another
	// store's unit of work in between.
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "1", true)))
		require.NoError(t, send.Send(ctx, order("k", "outer")))
		return other.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, dynamostore.AddItems(ctx, orderPut(other.Config().TableName, "9", true)), "this one goes to the other store's unit")
			return s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "2", true)))
				return send.Send(ctx, order("k", "inner"))
			})
		})
	}))
	reqs, _ := d.proxy.take()
	assert.Equal(t, 2, reqs["TransactWriteItems"], "one transaction per store")
	assert.NotNil(t, rawItem(t, d, table, "ORDER#1", "ORDER"))
	assert.NotNil(t, rawItem(t, d, table, "ORDER#2", "ORDER"))
	assert.Nil(t, rawItem(t, d, table, "ORDER#9", "ORDER"))
	assert.NotNil(t, rawItem(t, d, other.Config().TableName, "ORDER#9", "ORDER"))
	assert.Equal(t, []string{"outer", "inner"}, stored(t, s))
	assert.Empty(t, stored(t, other))
}

// AddItems and Transactional sends need the ctx the unit of work passes to its
// function; anything else fails loudly.
func TestAddItemsOutsideAUnitOfWork(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	outer := context.Background()
	send := newSender(t, s, outbox.Transactional)

	err := dynamostore.AddItems(outer, orderPut(table, "1", false))
	require.ErrorIs(t, err, outbox.ErrNoTransaction)
	assert.Contains(t, err.Error(), "the ctx that (*dynamostore.Store).Transact passes to its function")

	var leaked context.Context
	require.NoError(t, s.Transact(outer, func(ctx context.Context) error {
		leaked = ctx
		require.ErrorIs(t, dynamostore.AddItems(outer, orderPut(table, "2", false)), outbox.ErrNoTransaction,
			"the ctx Transact was called with is outside the unit")
		require.ErrorIs(t, send.Send(outer, order("k", "outer ctx")), outbox.ErrNoTransaction)
		return nil
	}))
	require.ErrorIs(t, dynamostore.AddItems(leaked, orderPut(table, "3", false)), outbox.ErrNoTransaction, "after the unit ended")
	require.ErrorIs(t, send.Send(leaked, order("k", "late")), outbox.ErrClosed)

	mem, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	require.NoError(t, mem.Transact(outer, func(ctx context.Context) error {
		require.ErrorIs(t, dynamostore.AddItems(ctx, orderPut(table, "4", false)), outbox.ErrNoTransaction,
			"another kind of store's unit of work")
		return nil
	}))

	reqs, _ := d.proxy.take()
	assert.Empty(t, reqs)
	assert.Empty(t, stored(t, s))
}

func TestEmptyUnitOfWorkMakesNoRequest(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	ctx := context.Background()
	require.NoError(t, s.Transact(ctx, func(context.Context) error { return nil }))
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error { return dynamostore.AddItems(ctx) }))
	reqs, _ := d.proxy.take()
	assert.Empty(t, reqs)
	assert.Empty(t, stored(t, s))
}

func TestTransactLimits(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	ctx := context.Background()
	send := newSender(t, s, outbox.Transactional)
	sendN := func(ctx context.Context, n int) {
		for i := range n {
			require.NoError(t, send.Send(ctx, order("k", fmt.Sprint(i))))
		}
	}
	tooLarge := func(err error, says string) {
		t.Helper()
		require.ErrorIs(t, err, outbox.ErrTooLarge)
		require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		assert.Contains(t, err.Error(), says)
	}

	// AddItems refuses items that cannot fit in one transaction on their own, and
	// adds nothing.
	require.EqualError(t, s.Transact(ctx, func(ctx context.Context) error {
		tooLarge(dynamostore.AddItems(ctx, blobPuts(table, 101, 1)...), "101 items")
		require.NoError(t, dynamostore.AddItems(ctx, blobPuts(table, 60, 1)...))
		tooLarge(dynamostore.AddItems(ctx, blobPuts(table, 41, 1)...), "101 items")
		tooLarge(dynamostore.AddItems(ctx, blobPuts(table, 1, 401*1024)...), "item 0")
		tooLarge(dynamostore.AddItems(ctx, blobPuts(table, 11, 390*1024)...), "4 MB")
		return errors.New("roll back")
	}), "roll back")

	// The commit refuses what was only known at its end, before any request.
	err := s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, blobPuts(table, 41, 1)...))
		sendN(ctx, 60)
		return nil
	})
	tooLarge(err, "101 items (41 application items and 60 messages)")
	assert.Contains(t, err.Error(), "nothing was written")

	err = s.Transact(ctx, func(ctx context.Context) error {
		return send.Send(ctx, overItem(s)) // within the capture's limit, not within an item
	})
	tooLarge(err, "400 KB item limit")

	err = s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, blobPuts(table, 10, 390*1024)...))
		return send.Send(ctx, order("k", strings.Repeat("x", 300*1024)))
	})
	tooLarge(err, "4 MB")

	tooLarge(s.Driver().Enqueue(ctx, func() []*driver.Envelope {
		out := make([]*driver.Envelope, 101)
		for i := range out {
			out[i] = envelope(t, 2, "t", []byte("k"), []byte("p"))
		}
		return out
	}()...), "at most 100")

	reqs, _ := d.proxy.take()
	assert.Empty(t, reqs, "every refusal happened before any request")
	assert.Empty(t, stored(t, s))

	// Exactly 100 items fit.
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "100", true)))
		sendN(ctx, 99)
		return nil
	}))
	assert.Len(t, stored(t, s), 99)
	assert.NotNil(t, rawItem(t, d, table, "ORDER#100", "ORDER"))
}
