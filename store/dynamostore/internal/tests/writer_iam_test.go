package tests

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// writerRole is the client of a writer whose IAM policy allows only
// dynamodb:PutItem and dynamodb:UpdateItem (a TransactWriteItems request is
// authorised per item by those two actions): every other call is denied.
type writerRole struct {
	dynamostore.Client
	denied atomic.Int64
}

var errDenied = errors.New("AccessDeniedException: the writer's role allows only dynamodb:PutItem and dynamodb:UpdateItem")

func (c *writerRole) deny() error { c.denied.Add(1); return errDenied }

func (c *writerRole) Query(context.Context, *ddb.QueryInput, ...func(*ddb.Options)) (*ddb.QueryOutput, error) {
	return nil, c.deny()
}

func (c *writerRole) DeleteItem(context.Context, *ddb.DeleteItemInput, ...func(*ddb.Options)) (*ddb.DeleteItemOutput, error) {
	return nil, c.deny()
}

func (c *writerRole) BatchGetItem(context.Context, *ddb.BatchGetItemInput, ...func(*ddb.Options)) (*ddb.BatchGetItemOutput, error) {
	return nil, c.deny()
}

func (c *writerRole) BatchWriteItem(context.Context, *ddb.BatchWriteItemInput, ...func(*ddb.Options)) (*ddb.BatchWriteItemOutput, error) {
	return nil, c.deny()
}

// TestWritersNeedOnlyPutItemAndUpdateItem: Enqueue and the unit of work, through a
// client that may only put and update, including when the SDK retries a request whose
// first attempt was applied: the refused retry returns the item standing under its
// key, so no read is needed to see that it is the writer's own.
func TestWritersNeedOnlyPutItemAndUpdateItem(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 2})
	table := s.Config().TableName
	role := &writerRole{Client: d.client}
	w, err := dynamostore.New(role, s.Config())
	require.NoError(t, err)
	ctx := context.Background()

	require.NoError(t, w.Driver().Enqueue(ctx, envelope(t, 2, "t", []byte("k"), []byte("a"))))
	d.proxy.loseNext("PutItem", 1)
	require.NoError(t, w.Driver().Enqueue(ctx, envelope(t, 2, "t", []byte("k"), []byte("b"))))
	d.proxy.loseNext("TransactWriteItems", 1)
	require.NoError(t, w.Driver().Enqueue(ctx, envelope(t, 2, "t", []byte("k"), []byte("c")), envelope(t, 2, "t", []byte("j"), []byte("d"))))
	send := newSender(t, w, outbox.Transactional)
	d.proxy.loseNext("TransactWriteItems", 1)
	require.NoError(t, w.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, dynamostore.AddItems(ctx, orderPut(table, "1", true)))
		return send.Send(ctx, order("k", "e"))
	}))
	d.proxy.loseNext("PutItem", 1)
	require.NoError(t, w.Transact(ctx, func(ctx context.Context) error {
		return send.Send(ctx, order("k", "f"))
	}))

	assert.Zero(t, role.denied.Load(), "a writer called something besides PutItem and UpdateItem")
	reqs, _ := d.proxy.take()
	for op := range reqs {
		assert.Contains(t, []string{"PutItem", "UpdateItem", "TransactWriteItems"}, op)
	}
	assert.ElementsMatch(t, []string{"a", "b", "c", "d", "e", "f"}, stored(t, s), "each message stored once")
}
