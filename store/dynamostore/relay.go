package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

const (
	// maxGapProbes bounds the gap probes of one fetch.
	maxGapProbes = 8
	// maxFetchRounds bounds how often one Fetch reads the head again after a probe
	// found a message the first read missed.
	maxFetchRounds = 3
	// maxBatchWrite is DynamoDB's BatchWriteItem limit.
	maxBatchWrite = 25
	// maxBatchAttempts bounds the requests spent on one batch's unprocessed items.
	maxBatchAttempts = 8
)

// Fetch returns up to limit pending envelopes of bucket in Seq order, due or not, with
// a strongly consistent Query of the bucket's partition.
//
// A Query is only read-committed against TransactWriteItems: it can return a later
// message of a committing transaction without an earlier one. So Fetch looks for
// sequence numbers missing from the batch, in Seq order: first below the first
// fetched message, down to the last message this store removed from the bucket (or
// the bucket's start, after the store took the bucket's lease), then between the
// fetched messages. It probes up to eight such gaps, lowest first, with a one-range
// strongly consistent Query each, and cuts the batch before the first gap it left
// unprobed: what it returns has no hole it did not look into. If a probe finds a
// message, Fetch reads the head again, at most three reads in all; after the last
// read the batch is cut before the first gap a probe found filled (which may leave it
// empty). A cut batch is shorter than limit and says so ([driver.Batch.More]): the
// rest comes with the next fetch, which the relay makes at once. More is set as well
// when the Query filled limit. Every call probes anew, so a batch that is fetched
// again after a failed publish is probed again too.
//
// A message item that lacks a required attribute (MessageId, Topic, CreatedAtUtc) or
// holds one that cannot be decoded is parked at once, with a LastError naming the
// attribute, and left out of the batch: it could never be published, and a foreign
// writer's malformed item must not block its bucket.
//
// A message stamped with another bucket count fails the fetch with
// [outbox.ErrMisconfigured].
func (s driverStore) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	if err := s.enter(ctx); err != nil {
		return driver.Batch{}, err
	}
	if err := s.checkBucket(bucket); err != nil {
		return driver.Batch{}, err
	}
	if limit <= 0 {
		return driver.Batch{}, nil
	}
	for round := 1; ; round++ {
		items, err := s.queryHead(ctx, bucket, limit)
		if err != nil {
			return driver.Batch{}, err
		}
		envs, err := s.decodeBatch(ctx, items, bucket)
		if err != nil {
			return driver.Batch{}, err
		}
		s.mu.Lock()
		lower := s.lastRemoved[bucket]
		s.mu.Unlock()
		ranges, cut := gaps(envs, lower)
		filled, err := s.probeGaps(ctx, bucket, ranges)
		if err != nil {
			s.forgetHeld(bucket)
			return driver.Batch{}, err
		}
		if filled < 0 {
			s.holdHead(bucket, envs, len(items), limit, cut == len(envs))
			return driver.Batch{Envelopes: envs[:cut], More: cut < len(envs) || len(items) >= limit}, nil
		}
		if round == maxFetchRounds {
			// No read left: return what lies below the first filled gap.
			s.forgetHeld(bucket)
			return driver.Batch{Envelopes: envs[:ranges[filled].before], More: true}, nil
		}
	}
}

// queryHead reads the first limit items of a bucket's partition, strongly consistent.
func (s *Store) queryHead(ctx context.Context, bucket, limit int) ([]map[string]types.AttributeValue, error) {
	var (
		items []map[string]types.AttributeValue
		start map[string]types.AttributeValue
	)
	for len(items) < limit {
		out, err := s.client.Query(ctx, &ddb.QueryInput{
			TableName:                 aws.String(s.cfg.TableName),
			KeyConditionExpression:    aws.String("#pk = :pk"),
			ExpressionAttributeNames:  map[string]string{"#pk": s.keys.pk},
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: s.keys.messages(bucket)}},
			ConsistentRead:            aws.Bool(true),
			Limit:                     aws.Int32(int32(min(limit-len(items), 1<<30))),
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return nil, s.translate(ctx, "fetch", err)
		}
		items = append(items, out.Items...)
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	return items, nil
}

func (s *Store) decodeBatch(ctx context.Context, items []map[string]types.AttributeValue, bucket int) ([]*driver.Envelope, error) {
	envs := make([]*driver.Envelope, 0, len(items))
	for _, item := range items {
		env, err := s.keys.decodePending(item, bucket)
		if err != nil {
			if perr := s.parkMalformed(ctx, bucket, item, err); perr != nil {
				return nil, perr
			}
			continue
		}
		if env.BucketCount == 0 {
			env.BucketCount = s.cfg.BucketCount // an unstamped message is not checked
		} else if env.BucketCount != s.cfg.BucketCount {
			return nil, fmt.Errorf("%w: dynamostore: message %s in bucket %d was written for %d buckets but this store has %d; drain the table before changing the bucket count",
				outbox.ErrMisconfigured, env.ID, bucket, env.BucketCount, s.cfg.BucketCount)
		}
		envs = append(envs, env)
	}
	return envs, nil
}

// parkMalformed moves a message item that cannot be decoded into its bucket's parked
// partition, unchanged but for LastError (the decoding failure, which names the
// attribute) and ParkedAtUtc, with one TransactWriteItems request. An item that is
// gone meanwhile is skipped.
func (s *Store) parkMalformed(ctx context.Context, bucket int, item map[string]types.AttributeValue, cause error) error {
	key := s.keys.key(s.keys.messages(bucket), stringAttr(item, s.keys.sk))
	parked := maps.Clone(item)
	parked[s.keys.pk] = &types.AttributeValueMemberS{Value: s.keys.parked(bucket)}
	parked[attrLastError] = &types.AttributeValueMemberS{Value: truncateError("malformed message item, parked without publishing: " + cause.Error())}
	parked[attrParkedAt] = ticksAttr(time.Now())
	_, err := s.client.TransactWriteItems(ctx, &ddb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Delete: &types.Delete{
			TableName:                aws.String(s.cfg.TableName),
			Key:                      key,
			ConditionExpression:      aws.String("attribute_exists(#sk)"),
			ExpressionAttributeNames: map[string]string{"#sk": s.keys.sk},
		}},
		{Put: &types.Put{TableName: aws.String(s.cfg.TableName), Item: parked}},
	}})
	if err != nil {
		if tce, ok := errors.AsType[*types.TransactionCanceledException](err); ok && conditionFailed(tce) {
			return nil // parked by a retried attempt of this request, or removed meanwhile
		}
		return s.translate(ctx, "park a malformed message item", err)
	}
	s.log.Warn("dynamostore: parked a malformed message item; fix its writer, then requeue or purge it",
		"bucket", bucket, "sort_key", stringAttr(item, s.keys.sk), "error", cause)
	return nil
}

// seqRange is an inclusive range of missing sequence numbers, below the batch's
// message with index before.
type seqRange struct {
	lo, hi int64
	before int
}

// gaps lists, lowest first, the ranges of sequence numbers above lower missing from a
// fetched batch: below the first message, then between messages; at most
// maxGapProbes of them. cut is the length of the batch below the first gap left out
// (len(envs) when none was).
func gaps(envs []*driver.Envelope, lower int64) (ranges []seqRange, cut int) {
	if len(envs) == 0 {
		return nil, 0
	}
	for i := range envs {
		lo, hi := lower+1, envs[i].Seq-1
		if i > 0 {
			lo = max(envs[i-1].Seq+1, lo)
		}
		if lo > hi {
			continue
		}
		if len(ranges) == maxGapProbes {
			return ranges, i
		}
		ranges = append(ranges, seqRange{lo, hi, i})
	}
	return ranges, len(envs)
}

// probeGaps probes every range with a one-range strongly consistent Query, up to
// MaxConcurrency at once, and returns the index of the lowest range that holds a
// message now, or -1.
func (s *Store) probeGaps(ctx context.Context, bucket int, ranges []seqRange) (int, error) {
	if len(ranges) == 0 {
		return -1, nil
	}
	found := make([]atomic.Bool, len(ranges))
	err := s.forEach(ctx, len(ranges), func(ctx context.Context, i int) error {
		out, err := s.client.Query(ctx, &ddb.QueryInput{
			TableName:                aws.String(s.cfg.TableName),
			KeyConditionExpression:   aws.String("#pk = :pk AND #sk BETWEEN :lo AND :hi"),
			ExpressionAttributeNames: map[string]string{"#pk": s.keys.pk, "#sk": s.keys.sk},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":pk": &types.AttributeValueMemberS{Value: s.keys.messages(bucket)},
				":lo": &types.AttributeValueMemberS{Value: seqSortKey(ranges[i].lo)},
				":hi": &types.AttributeValueMemberS{Value: seqSortKey(ranges[i].hi)},
			},
			ProjectionExpression: aws.String("#sk"),
			ConsistentRead:       aws.Bool(true),
			Limit:                aws.Int32(1),
		})
		if err != nil {
			return s.translate(ctx, "probe a sequence gap", err)
		}
		if len(out.Items) > 0 {
			found[i].Store(true)
		}
		return nil
	})
	if err != nil {
		return -1, err
	}
	for i := range found {
		if found[i].Load() {
			return i, nil
		}
	}
	return -1, nil
}

// Complete deletes the envelopes with BatchWriteItem, 25 keys per request and up to
// MaxConcurrency requests at once. Keys DynamoDB leaves unprocessed (throttling) are
// retried with exponential backoff; if some are still left, Complete returns an error
// and those messages stay, to be published again: a duplicate, never a loss. Deleting
// a message that is gone is not an error.
func (s driverStore) Complete(ctx context.Context, envs []*driver.Envelope) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	var (
		requests []types.WriteRequest
		seen     = make(map[[2]int64]struct{}, len(envs))
		highest  = make(map[int]int64)
	)
	for _, env := range envs {
		if env == nil {
			continue
		}
		if err := s.checkBucket(env.Bucket); err != nil {
			return err
		}
		k := [2]int64{int64(env.Bucket), env.Seq}
		if _, dup := seen[k]; dup {
			continue // BatchWriteItem refuses a key twice
		}
		seen[k] = struct{}{}
		requests = append(requests, types.WriteRequest{DeleteRequest: &types.DeleteRequest{
			Key: s.keys.key(s.keys.messages(env.Bucket), seqSortKey(env.Seq)),
		}})
		highest[env.Bucket] = max(highest[env.Bucket], env.Seq)
	}
	if len(requests) == 0 {
		return nil
	}
	chunks := (len(requests) + maxBatchWrite - 1) / maxBatchWrite
	err := s.forEach(ctx, chunks, func(ctx context.Context, i int) error {
		return s.batchWrite(ctx, "complete", requests[i*maxBatchWrite:min((i+1)*maxBatchWrite, len(requests))])
	})
	if err != nil {
		return err
	}
	s.mu.Lock()
	for b, seq := range highest {
		s.lastRemoved[b] = max(s.lastRemoved[b], seq)
	}
	for k := range seen {
		s.updateHeld(int(k[0]), k[1], func(*heldMsg) bool { return false })
	}
	s.mu.Unlock()
	return nil
}

// batchWrite sends one BatchWriteItem and retries what comes back unprocessed.
func (s *Store) batchWrite(ctx context.Context, op string, requests []types.WriteRequest) error {
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := sleep(ctx, backoff(attempt)); err != nil {
				return err
			}
		}
		out, err := s.client.BatchWriteItem(ctx, &ddb.BatchWriteItemInput{
			RequestItems: map[string][]types.WriteRequest{s.cfg.TableName: requests},
		})
		if err != nil {
			return s.translate(ctx, op, err)
		}
		requests = out.UnprocessedItems[s.cfg.TableName]
		if len(requests) == 0 {
			return nil
		}
		if attempt+1 == maxBatchAttempts {
			s.log.Warn("dynamostore: writes left unprocessed after every retry; the messages stay and are published again",
				"op", op, "unprocessed", len(requests))
			return fmt.Errorf("dynamostore: %s: %d writes left unprocessed after %d attempts (throttled)", op, len(requests), maxBatchAttempts)
		}
	}
}

// backoff is the wait before retry number attempt (1, 2, ...): exponential from 25 ms,
// capped at 1 s, with full jitter on its upper half.
func backoff(attempt int) time.Duration {
	d := min(25*time.Millisecond<<(attempt-1), time.Second)
	return d/2 + rand.N(d/2+1)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reschedule records a failed attempt on the stored message: Attempts+1, due at next,
// LastError=cause (cut to 2 KB). A message that is gone is skipped.
func (s driverStore) Reschedule(ctx context.Context, env *driver.Envelope, next time.Time, cause string) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	if err := s.checkBucket(env.Bucket); err != nil {
		return err
	}
	_, err := s.client.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:        aws.String(s.cfg.TableName),
		Key:              s.keys.key(s.keys.messages(env.Bucket), seqSortKey(env.Seq)),
		UpdateExpression: aws.String("SET #next = :next, #err = :err ADD #att :one"),
		// The condition also keeps the update from creating a stray item when the
		// message was completed meanwhile.
		ConditionExpression: aws.String("#id = :id"),
		ExpressionAttributeNames: map[string]string{
			"#next": attrNextAttemptAt, "#err": attrLastError, "#att": attrAttempts, "#id": attrMessageID,
		},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":next": ticksAttr(next),
			":err":  &types.AttributeValueMemberS{Value: truncateError(cause)},
			":one":  numberAttr(1),
			":id":   &types.AttributeValueMemberS{Value: env.ID.String()},
		},
	})
	if err == nil || isConditionFailed(err) {
		s.mu.Lock()
		s.updateHeld(env.Bucket, env.Seq, func(m *heldMsg) bool { m.next = next; return err == nil })
		s.mu.Unlock()
		return nil
	}
	s.forgetHeld(env.Bucket)
	return s.translate(ctx, "reschedule", err)
}

// Park moves the message out of its bucket's partition into the bucket's parked
// partition, with Attempts+1, LastError=cause and ParkedAtUtc. It records the failure
// on the stored message first (one UpdateItem that returns the whole item), then moves
// that item with one TransactWriteItems request, so the parked copy is exactly what
// was stored. Fetch never reads parked messages again; an operator requeues or purges
// them (Requeue, Purge). A message that is gone is skipped.
func (s driverStore) Park(ctx context.Context, env *driver.Envelope, cause string) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	if err := s.checkBucket(env.Bucket); err != nil {
		return err
	}
	key := s.keys.key(s.keys.messages(env.Bucket), seqSortKey(env.Seq))
	idCond := map[string]types.AttributeValue{":id": &types.AttributeValueMemberS{Value: env.ID.String()}}
	out, err := s.client.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                aws.String(s.cfg.TableName),
		Key:                      key,
		UpdateExpression:         aws.String("SET #err = :err ADD #att :one"),
		ConditionExpression:      aws.String("#id = :id"),
		ExpressionAttributeNames: map[string]string{"#err": attrLastError, "#att": attrAttempts, "#id": attrMessageID},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":err": &types.AttributeValueMemberS{Value: truncateError(cause)},
			":one": numberAttr(1),
			":id":  idCond[":id"],
		},
		ReturnValues: types.ReturnValueAllNew,
	})
	if isConditionFailed(err) {
		return nil // gone: completed, or parked by an earlier call
	}
	if err != nil {
		return s.translate(ctx, "park", err)
	}
	item := out.Attributes
	item[s.keys.pk] = &types.AttributeValueMemberS{Value: s.keys.parked(env.Bucket)}
	item[attrParkedAt] = ticksAttr(time.Now())
	_, err = s.client.TransactWriteItems(ctx, &ddb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
		{Delete: &types.Delete{
			TableName:                 aws.String(s.cfg.TableName),
			Key:                       key,
			ConditionExpression:       aws.String("#id = :id"),
			ExpressionAttributeNames:  map[string]string{"#id": attrMessageID},
			ExpressionAttributeValues: idCond,
		}},
		{Put: &types.Put{TableName: aws.String(s.cfg.TableName), Item: item}},
	}})
	if err != nil {
		if tce, ok := errors.AsType[*types.TransactionCanceledException](err); ok && conditionFailed(tce) {
			return nil // moved by a retried attempt of this request, or completed meanwhile
		}
		return s.translate(ctx, "park", err)
	}
	s.mu.Lock()
	s.lastRemoved[env.Bucket] = max(s.lastRemoved[env.Bucket], env.Seq)
	s.updateHeld(env.Bucket, env.Seq, func(*heldMsg) bool { return false })
	s.mu.Unlock()
	return nil
}
