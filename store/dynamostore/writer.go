package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// MaxEnqueue is the most messages one Enqueue call writes (on the handle or the
// relay side): one TransactWriteItems request holds at most 100 items.
const MaxEnqueue = maxTransactItems

// Enqueue writes up to [MaxEnqueue] messages all or nothing, in a write of their own
// (for messages that have no business write), and wakes local subscribers; a
// message with a zero ID gets one. It reserves one range of sequence numbers per
// distinct bucket (messages sharing a bucket keep their list order), then writes a
// single message with one conditional PutItem and several with one
// TransactWriteItems.
//
// It is safe under the SDK's retries: if a retried request finds its own items
// already written (the first attempt was applied but its response was lost), the
// store checks that the item the refused request returns (every put asks for it with
// ReturnValuesOnConditionCheckFailure ALL_OLD) carries the message's ID, and reports
// success; no read is needed, so a writer needs only dynamodb:PutItem and
// dynamodb:UpdateItem. Calling Enqueue again after an ambiguous error is different:
// the messages get new sequence numbers and may be stored twice under the same ID
// (at-least-once, as after a lease takeover).
func (s *Store) Enqueue(ctx context.Context, msgs ...outbox.Message) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	if len(msgs) > MaxEnqueue {
		return fmt.Errorf("%w: dynamostore: Enqueue takes at most %d messages per call (one transaction), got %d; split the batch",
			outbox.ErrTooLarge, MaxEnqueue, len(msgs))
	}
	envs, err := driver.NewEnvelopes(msgs, s.cfg.BucketCount)
	if err != nil {
		return fmt.Errorf("dynamostore: Enqueue: %w", err)
	}
	return s.enqueue(ctx, envs)
}

// Enqueue writes up to [MaxEnqueue] envelopes all or nothing and sets their Seq, as
// the handle's Enqueue writes messages.
func (s driverStore) Enqueue(ctx context.Context, envs ...*driver.Envelope) error {
	return s.enqueue(ctx, envs)
}

func (s *Store) enqueue(ctx context.Context, envs []*driver.Envelope) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	if len(envs) == 0 {
		return nil
	}
	if len(envs) > MaxEnqueue {
		return fmt.Errorf("%w: dynamostore: Enqueue takes at most %d envelopes per call (one transaction), got %d; split the batch",
			outbox.ErrTooLarge, MaxEnqueue, len(envs))
	}
	size, err := s.check(envs)
	if err != nil {
		return err
	}
	if size > maxTransactSize {
		return fmt.Errorf("%w: dynamostore: the envelopes take about %d bytes, over a transaction's 4 MB; split the batch", outbox.ErrTooLarge, size)
	}
	if err := s.reserve(ctx, envs); err != nil {
		return err
	}
	if len(envs) == 1 {
		err = s.putOne(ctx, "enqueue", envs[0])
	} else {
		err = s.transact(ctx, "enqueue", nil, envs)
	}
	if err != nil {
		return err
	}
	s.notify(envs)
	return nil
}

// putOne writes one envelope with a conditional PutItem: one write unit less than a
// transaction.
func (s *Store) putOne(ctx context.Context, op string, env *driver.Envelope) error {
	put := s.put(env)
	_, err := s.client.PutItem(ctx, &ddb.PutItemInput{
		TableName:                           put.TableName,
		Item:                                put.Item,
		ConditionExpression:                 put.ConditionExpression,
		ExpressionAttributeNames:            put.ExpressionAttributeNames,
		ReturnValuesOnConditionCheckFailure: put.ReturnValuesOnConditionCheckFailure,
	})
	if err == nil {
		return nil
	}
	if ccf, ok := errors.AsType[*types.ConditionalCheckFailedException](err); ok {
		// The refused put returns the item that stands under its key.
		if stringAttr(ccf.Item, attrMessageID) == env.ID.String() {
			return nil // a retry of a put whose first attempt was applied
		}
		return fmt.Errorf("dynamostore: %s: sequence number %d of bucket %d is already taken by another message: was the %s counter item reset? %w",
			op, env.Seq, env.Bucket, s.keys.sequence(env.Bucket), err)
	}
	return s.translate(ctx, op, err)
}

// CreateTransactWriteItems is for an application that builds its own
// TransactWriteItems request instead of using [Store.Transact]. It takes the
// messages staged on ctx's scope (sends made with the ctx of [outbox.NewScope]),
// reserves their sequence numbers (one reservation per distinct bucket; messages
// sharing a bucket keep their send order) and returns one conditional Put per
// message, in send order, to append to the request. Each Put carries
// attribute_not_exists on the partition key, so a reset counter fails the
// transaction instead of overwriting a pending message. It returns no item when ctx
// has no scope or the scope holds nothing.
//
// The messages leave the scope: a rebuilt request needs new items. So open the
// scope, send and call CreateTransactWriteItems inside the caller's retry loop: a
// transaction rebuilt after losing an optimistic-concurrency race sends again and
// reserves again. After the transaction commits, pass the items (or the request's
// whole TransactItems) to [Store.NotifyCommitted], then Release the scope.
//
// Every message is checked first; a refused call takes the messages but reserves
// nothing. It refuses more than 100 messages, or one whose item would be over
// 400 KB, with [outbox.ErrTooLarge]; the request as a whole must also stay within
// DynamoDB's 100 items and 4 MB, which the caller checks. Inside [Store.Transact] no
// call is needed: the unit of work writes its sends, and [AddItems] adds the
// application's items to it.
func (s *Store) CreateTransactWriteItems(ctx context.Context) ([]types.TransactWriteItem, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	envs, err := driver.Take(ctx, s.cfg.BucketCount)
	if err != nil {
		return nil, fmt.Errorf("dynamostore: CreateTransactWriteItems: %w", err)
	}
	if len(envs) == 0 {
		return nil, nil
	}
	if len(envs) > maxTransactItems {
		return nil, fmt.Errorf("%w: dynamostore: %d messages cannot fit in one transaction of %d items", outbox.ErrTooLarge, len(envs), maxTransactItems)
	}
	if _, err := s.check(envs); err != nil {
		return nil, err
	}
	if err := s.reserve(ctx, envs); err != nil {
		return nil, err
	}
	items := make([]types.TransactWriteItem, len(envs))
	for i, env := range envs {
		items[i] = types.TransactWriteItem{Put: s.put(env)}
	}
	return items, nil
}

// NotifyCommitted wakes the local subscribers of the buckets that items write
// messages to: the items of [Store.CreateTransactWriteItems], alone or among the
// other items of the request; items that are not this store's message Puts are
// ignored. Call it only after the transaction committed; it is optional, because
// relays also poll. [Store.Transact] and [Store.Enqueue] notify on their own.
func (s *Store) NotifyCommitted(items ...types.TransactWriteItem) {
	var buckets []int
	for _, it := range items {
		if it.Put == nil || aws.ToString(it.Put.TableName) != s.cfg.TableName {
			continue
		}
		pk, _ := it.Put.Item[s.keys.pk].(*types.AttributeValueMemberS)
		sk, _ := it.Put.Item[s.keys.sk].(*types.AttributeValueMemberS)
		if pk == nil || sk == nil {
			continue
		}
		if b, _, ok := s.messageKey(pk.Value, sk.Value); ok && b < s.cfg.BucketCount && !slices.Contains(buckets, b) {
			buckets = append(buckets, b)
		}
	}
	s.wake(buckets)
}

// notify wakes the local subscribers of the envelopes' buckets, after their commit.
func (s *Store) notify(envs []*driver.Envelope) {
	buckets := make([]int, 0, min(len(envs), s.cfg.BucketCount))
	for _, env := range envs {
		if env != nil && !slices.Contains(buckets, env.Bucket) {
			buckets = append(buckets, env.Bucket)
		}
	}
	s.wake(buckets)
}

func (s *Store) wake(buckets []int) {
	if len(buckets) == 0 {
		return
	}
	s.forgetHeld(buckets...)
	s.hub.Notify(buckets...)
}

// check refuses envelopes that cannot be stored and returns their total item size.
func (s *Store) check(envs []*driver.Envelope) (int, error) {
	size := 0
	seen := make(map[uuid.UUID]struct{}, len(envs))
	for i, env := range envs {
		if env == nil {
			return 0, fmt.Errorf("%w: dynamostore: envelope %d is nil", outbox.ErrInvalidMessage, i)
		}
		if env.BucketCount != s.cfg.BucketCount {
			return 0, fmt.Errorf("%w: dynamostore: envelope %s was stamped for %d buckets but the store has %d; give the writer and the store the same bucket count",
				outbox.ErrMisconfigured, env.ID, env.BucketCount, s.cfg.BucketCount)
		}
		if env.Bucket < 0 || env.Bucket >= s.cfg.BucketCount {
			return 0, fmt.Errorf("%w: dynamostore: envelope %s has bucket %d outside 0..%d", outbox.ErrInvalidMessage, env.ID, env.Bucket, s.cfg.BucketCount-1)
		}
		if env.ID == uuid.Nil {
			return 0, fmt.Errorf("%w: dynamostore: envelope %d has no ID; build envelopes with driver.NewEnvelope", outbox.ErrInvalidMessage, i)
		}
		if err := env.Validate(); err != nil {
			return 0, fmt.Errorf("dynamostore: envelope %s: %w", env.ID, err)
		}
		if !utf8.ValidString(env.Topic) {
			return 0, fmt.Errorf("%w: dynamostore: envelope %s: topic is not valid UTF-8, which a string attribute must be", outbox.ErrInvalidMessage, env.ID)
		}
		if _, dup := seen[env.ID]; dup {
			return 0, fmt.Errorf("%w: dynamostore: envelope %s appears twice in one write", outbox.ErrInvalidMessage, env.ID)
		}
		seen[env.ID] = struct{}{}
		// Seq does not change the size: the sort key has a fixed width.
		n := itemSize(s.keys.messageItem(env, s.keys.messages(env.Bucket)))
		if n > maxWrittenItem {
			return 0, fmt.Errorf("%w: dynamostore: envelope %s needs a %d-byte item; with the %d bytes a failed publish may add to it (attempts, next attempt, error text), that is over DynamoDB's 400 KB item limit, so at most %d bytes are accepted; keep large payloads elsewhere and send a reference",
				outbox.ErrTooLarge, env.ID, n, failureRoom, maxWrittenItem)
		}
		size += n
	}
	return size, nil
}

// reserve takes sequence numbers from each bucket's counter, one UpdateItem per
// distinct bucket, and assigns them in list order.
func (s *Store) reserve(ctx context.Context, envs []*driver.Envelope) error {
	var buckets []int
	members := make(map[int][]*driver.Envelope)
	for _, env := range envs {
		if _, ok := members[env.Bucket]; !ok {
			buckets = append(buckets, env.Bucket)
		}
		members[env.Bucket] = append(members[env.Bucket], env)
	}
	return s.forEach(ctx, len(buckets), func(ctx context.Context, i int) error {
		b := buckets[i]
		group := members[b]
		out, err := s.client.UpdateItem(ctx, &ddb.UpdateItemInput{
			TableName:                 aws.String(s.cfg.TableName),
			Key:                       s.keys.key(s.keys.sequence(b), sequenceSortKey),
			UpdateExpression:          aws.String("ADD #seq :n"),
			ExpressionAttributeNames:  map[string]string{"#seq": attrSequence},
			ExpressionAttributeValues: map[string]types.AttributeValue{":n": numberAttr(int64(len(group)))},
			ReturnValues:              types.ReturnValueUpdatedNew,
		})
		if err != nil {
			return s.translate(ctx, "reserve sequence numbers", err)
		}
		last, ok, err := intAttr(out.Attributes, attrSequence)
		if err != nil || !ok {
			return fmt.Errorf("dynamostore: reserve sequence numbers: counter of bucket %d returned no number (%v)", b, err)
		}
		first := last - int64(len(group)) + 1
		for j, env := range group {
			env.Seq = first + int64(j)
		}
		return nil
	})
}

// put is the conditional Put of one envelope whose Seq is reserved.
func (s *Store) put(env *driver.Envelope) *types.Put {
	return &types.Put{
		TableName:                           aws.String(s.cfg.TableName),
		Item:                                s.keys.messageItem(env, s.keys.messages(env.Bucket)),
		ConditionExpression:                 aws.String("attribute_not_exists(#pk)"),
		ExpressionAttributeNames:            map[string]string{"#pk": s.keys.pk},
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	}
}

// transact writes appItems and envs in one TransactWriteItems request.
func (s *Store) transact(ctx context.Context, op string, appItems []types.TransactWriteItem, envs []*driver.Envelope) error {
	items := make([]types.TransactWriteItem, 0, len(appItems)+len(envs))
	items = append(items, appItems...)
	for _, env := range envs {
		items = append(items, types.TransactWriteItem{Put: s.put(env)})
	}
	_, err := s.client.TransactWriteItems(ctx, &ddb.TransactWriteItemsInput{TransactItems: items})
	if err == nil {
		return nil
	}
	if tce, ok := errors.AsType[*types.TransactionCanceledException](err); ok && len(envs) > 0 && conditionFailed(tce) {
		// A retry of a request whose first attempt was applied fails its conditions.
		// The sequence numbers were reserved for this call alone, so finding every
		// envelope under its own number proves the transaction committed.
		if s.ownItems(tce, len(appItems), envs) {
			return nil
		}
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if cerr := errCancelled(op, len(appItems), err); cerr != nil {
		return cerr
	}
	return s.translate(ctx, op, err)
}

func conditionFailed(tce *types.TransactionCanceledException) bool {
	for _, r := range tce.CancellationReasons {
		if aws.ToString(r.Code) == "ConditionalCheckFailed" {
			return true
		}
	}
	return false
}

// ownItems reports whether a cancelled transaction found one of its envelopes already
// stored under its own sequence number: the refused request returns the item standing
// under each failed condition (ReturnValuesOnConditionCheckFailure ALL_OLD), so no
// read is needed. The numbers were reserved for this call alone and a transaction is
// all or nothing, so one envelope found proves that an earlier attempt of this very
// request committed all of it. The envelopes' puts follow skip application items.
func (s *Store) ownItems(tce *types.TransactionCanceledException, skip int, envs []*driver.Envelope) bool {
	if len(tce.CancellationReasons) != skip+len(envs) {
		return false
	}
	for i, env := range envs {
		r := tce.CancellationReasons[skip+i]
		if aws.ToString(r.Code) == "ConditionalCheckFailed" && stringAttr(r.Item, attrMessageID) == env.ID.String() {
			return true
		}
	}
	return false
}
