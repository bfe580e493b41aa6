package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
)

// Inbox item layout: one item per recorded key and consumer, in the outbox's table.
//
//	PK              S  KeyPrefix + "#INBOX#" + key
//	SK              S  "CONSUMER#" + consumer
//	Consumer        S  the consumer name
//	InboxKey        S  the message's key
//	InboxExpiresAt  N  Unix seconds after which DynamoDB's TTL may delete the item
//
// The partition key is the message's key, so keys spread over partitions; the
// consumers of one message share its partition key.
const (
	// InboxTTLAttributeName is the attribute of the inbox items that DynamoDB's TTL
	// must be enabled on (UpdateTimeToLive) for expired keys to be removed: a
	// number, Unix seconds. The outbox's own items never carry it.
	InboxTTLAttributeName = "InboxExpiresAt"

	attrInboxConsumer = "Consumer"
	attrInboxKey      = "InboxKey"
	inboxSKPrefix     = "CONSUMER#"
)

var _ inbox.Store = driverStore{}

func (k keys) inbox(key string) string { return k.prefix + "#INBOX#" + key }

// StageInboxKey records key in the unit of work on ctx, for an [inbox.Inbox]. It
// reads the key's item first (one strongly consistent Query of one item): when it
// exists, it returns an error wrapping [inbox.ErrDuplicate] and the consumer's
// function is skipped. Otherwise it adds a Put of the key's item, conditional on
// attribute_not_exists, to the unit's TransactWriteItems: if a racing unit records
// the key first, DynamoDB cancels the whole transaction, and the returned function
// recognises the cancellation reason of that item (by the item it returns, or by its
// place among the unit's items) as a duplicate.
//
// The key's item counts against the unit's 100 items like an item of [AddItems].
// Keys are removed by DynamoDB's TTL on [InboxTTLAttributeName], which must be
// enabled on the table; until it deletes an item (TTL may take days past the expiry),
// the key still counts as recorded.
//
// A unit of only the key (a function that writes nothing) is written as a
// transaction too. If the SDK retries a transaction whose first attempt committed,
// the retry fails on the key's condition and, when the unit sent no message whose
// sequence numbers prove the commit, the inbox reports a duplicate: the effects
// were committed once, as promised, and the message is acknowledged either way.
func (s driverStore) StageInboxKey(ctx context.Context, key inbox.Key) (func(error) bool, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	switch {
	case key.Consumer == "" || len(key.Consumer) > inbox.MaxConsumerLength || !utf8.ValidString(key.Consumer):
		return nil, fmt.Errorf("%w: dynamostore: inbox consumer %q: it must be valid UTF-8 of 1 to %d bytes", outbox.ErrMisconfigured, key.Consumer, inbox.MaxConsumerLength)
	case key.ID == "" || len(key.ID) > inbox.MaxKeyLength || !utf8.ValidString(key.ID):
		return nil, fmt.Errorf("%w: dynamostore: inbox key %q: it must be valid UTF-8 of 1 to %d bytes (inbox.Inbox hashes longer keys)", outbox.ErrInvalidMessage, key.ID, inbox.MaxKeyLength)
	}
	u, ok := driver.TxFrom[*unit](ctx)
	if !ok || u.s != s.Store {
		return nil, fmt.Errorf("dynamostore: StageInboxKey: call it with the ctx that this store's Transact passes to its function: %w", outbox.ErrNoTransaction)
	}
	pk, sk := s.keys.inbox(key.ID), inboxSKPrefix+key.Consumer
	out, err := s.client.Query(ctx, &ddb.QueryInput{
		TableName:              aws.String(s.cfg.TableName),
		KeyConditionExpression: aws.String("#pk = :pk AND #sk = :sk"),
		ExpressionAttributeNames: map[string]string{
			"#pk": s.keys.pk, "#sk": s.keys.sk,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":pk": &types.AttributeValueMemberS{Value: pk},
			":sk": &types.AttributeValueMemberS{Value: sk},
		},
		ProjectionExpression: aws.String("#pk"),
		ConsistentRead:       aws.Bool(true),
		Limit:                aws.Int32(1),
	})
	if err != nil {
		return nil, s.translate(ctx, "read inbox key", err)
	}
	if len(out.Items) > 0 {
		return nil, fmt.Errorf("dynamostore: key %q of consumer %q: %w", key.ID, key.Consumer, inbox.ErrDuplicate)
	}
	item := s.keys.key(pk, sk)
	item[attrInboxConsumer] = &types.AttributeValueMemberS{Value: key.Consumer}
	item[attrInboxKey] = &types.AttributeValueMemberS{Value: key.ID}
	item[InboxTTLAttributeName] = &types.AttributeValueMemberN{Value: strconv.FormatInt(key.ExpiresAt.Unix(), 10)}
	put := types.TransactWriteItem{Put: &types.Put{
		TableName:                           aws.String(s.cfg.TableName),
		Item:                                item,
		ConditionExpression:                 aws.String("attribute_not_exists(#pk)"),
		ExpressionAttributeNames:            map[string]string{"#pk": s.keys.pk},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}}
	// The key's item is the unit's next application item: its cancellation reason
	// sits at that index (application items come first, in the order added).
	index := u.mark()
	if err := u.add([]types.TransactWriteItem{put}); err != nil {
		return nil, err
	}
	return func(commitErr error) bool { return s.inboxCancelled(commitErr, pk, sk, index) }, nil
}

// inboxCancelled reports whether err is a cancelled transaction whose reason for the
// inbox item pk/sk is its failed condition: the item exists, the key is recorded.
// The reason is the one that returns the item (ALL_OLD), or, from a server that
// returns no item, the one at index, the key item's place in the request.
func (s *Store) inboxCancelled(err error, pk, sk string, index int) bool {
	tce, ok := errors.AsType[*types.TransactionCanceledException](err)
	if !ok {
		return false
	}
	for i, r := range tce.CancellationReasons {
		if aws.ToString(r.Code) != "ConditionalCheckFailed" {
			continue
		}
		if len(r.Item) == 0 {
			if i == index {
				return true
			}
			continue
		}
		gotPK, _ := r.Item[s.keys.pk].(*types.AttributeValueMemberS)
		gotSK, _ := r.Item[s.keys.sk].(*types.AttributeValueMemberS)
		if gotPK != nil && gotSK != nil && gotPK.Value == pk && gotSK.Value == sk {
			return true
		}
	}
	return false
}
