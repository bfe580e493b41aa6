package dynamostore

import (
	"context"
	"errors"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox/driver"
)

// partitionOf returns the partition key holding envelopes of status in bucket, or ""
// for a status this store never holds (Dispatched: the store keeps no retention).
func (s *Store) partitionOf(status driver.Status, bucket int) string {
	switch status {
	case driver.Pending:
		return s.keys.messages(bucket)
	case driver.Parked:
		return s.keys.parked(bucket)
	}
	return ""
}

// List returns envelopes with status, ordered by bucket then Seq, after the cursor, at
// most limit, with strongly consistent queries of one bucket partition after another.
// Dispatched envelopes are never kept, so listing them returns nothing.
func (s driverStore) List(ctx context.Context, status driver.Status, after driver.Cursor, limit int) ([]*driver.Envelope, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	var out []*driver.Envelope
	for b := max(after.Bucket, 0); b < s.cfg.BucketCount && len(out) < limit; b++ {
		pk := s.partitionOf(status, b)
		if pk == "" {
			return nil, nil
		}
		var from int64
		if b == after.Bucket {
			from = after.Seq
		}
		var start map[string]types.AttributeValue
		for len(out) < limit {
			page, err := s.client.Query(ctx, &ddb.QueryInput{
				TableName:                aws.String(s.cfg.TableName),
				KeyConditionExpression:   aws.String("#pk = :pk AND #sk > :from"),
				ExpressionAttributeNames: map[string]string{"#pk": s.keys.pk, "#sk": s.keys.sk},
				ExpressionAttributeValues: map[string]types.AttributeValue{
					":pk":   &types.AttributeValueMemberS{Value: pk},
					":from": &types.AttributeValueMemberS{Value: seqSortKey(max(from, 0))},
				},
				ConsistentRead:    aws.Bool(true),
				Limit:             aws.Int32(int32(min(limit-len(out), 1<<30))),
				ExclusiveStartKey: start,
			})
			if err != nil {
				return nil, s.translate(ctx, "list", err)
			}
			for _, item := range page.Items {
				env, err := s.keys.decodeMessage(item, b, status)
				if err != nil {
					return nil, err
				}
				out = append(out, env)
			}
			if len(page.LastEvaluatedKey) == 0 {
				break
			}
			start = page.LastEvaluatedKey
		}
	}
	return out, nil
}

// scanPartitions reads every item of the given partitions (one per bucket), with the
// projection given, and calls keep for each; keep runs on one goroutine at a time.
func (s *Store) scanPartitions(ctx context.Context, op string, pks []string, projection *string, names map[string]string,
	keep func(bucket int, item map[string]types.AttributeValue)) error {
	var mu sync.Mutex
	return s.forEach(ctx, len(pks), func(ctx context.Context, i int) error {
		var start map[string]types.AttributeValue
		allNames := map[string]string{"#pk": s.keys.pk}
		maps.Copy(allNames, names)
		for {
			page, err := s.client.Query(ctx, &ddb.QueryInput{
				TableName:                 aws.String(s.cfg.TableName),
				KeyConditionExpression:    aws.String("#pk = :pk"),
				ExpressionAttributeNames:  allNames,
				ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: pks[i]}},
				ProjectionExpression:      projection,
				ConsistentRead:            aws.Bool(true),
				ExclusiveStartKey:         start,
			})
			if err != nil {
				return s.translate(ctx, op, err)
			}
			mu.Lock()
			for _, item := range page.Items {
				keep(i%s.cfg.BucketCount, item)
			}
			mu.Unlock()
			if len(page.LastEvaluatedKey) == 0 {
				return nil
			}
			start = page.LastEvaluatedKey
		}
	})
}

func idSet(ids []uuid.UUID) map[string]struct{} {
	set := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		set[id.String()] = struct{}{}
	}
	return set
}

// Requeue moves parked envelopes back into their bucket's partition under their
// original Seq, pending and due now, with Attempts reset (LastError stays as
// evidence). It reads every bucket's parked partition to find the IDs, then moves each
// envelope with one TransactWriteItems request. It returns how many it moved; unknown
// or non-parked IDs are skipped.
func (s driverStore) Requeue(ctx context.Context, ids ...uuid.UUID) (int, error) {
	if err := s.enter(ctx); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	want := idSet(ids)
	pks := make([]string, s.cfg.BucketCount)
	for b := range pks {
		pks[b] = s.keys.parked(b)
	}
	type found struct {
		bucket int
		item   map[string]types.AttributeValue
	}
	var moves []found
	err := s.scanPartitions(ctx, "requeue", pks, nil, nil, func(b int, item map[string]types.AttributeValue) {
		if _, ok := want[stringAttr(item, attrMessageID)]; ok {
			moves = append(moves, found{b, item})
		}
	})
	if err != nil || len(moves) == 0 {
		return 0, err
	}
	var moved atomic.Int64
	err = s.forEach(ctx, len(moves), func(ctx context.Context, i int) error {
		parkedItem := moves[i].item
		sk := stringAttr(parkedItem, s.keys.sk)
		pending := maps.Clone(parkedItem)
		for _, attr := range []string{attrParkedAt, attrAttempts, attrNextAttemptAt} {
			delete(pending, attr)
		}
		pending[s.keys.pk] = &types.AttributeValueMemberS{Value: s.keys.messages(moves[i].bucket)}
		_, err := s.client.TransactWriteItems(ctx, &ddb.TransactWriteItemsInput{TransactItems: []types.TransactWriteItem{
			{Delete: &types.Delete{
				TableName:                 aws.String(s.cfg.TableName),
				Key:                       s.keys.key(s.keys.parked(moves[i].bucket), sk),
				ConditionExpression:       aws.String("#id = :id"),
				ExpressionAttributeNames:  map[string]string{"#id": attrMessageID},
				ExpressionAttributeValues: map[string]types.AttributeValue{":id": parkedItem[attrMessageID]},
			}},
			{Put: &types.Put{
				TableName:                aws.String(s.cfg.TableName),
				Item:                     pending,
				ConditionExpression:      aws.String("attribute_not_exists(#pk)"),
				ExpressionAttributeNames: map[string]string{"#pk": s.keys.pk},
			}},
		}})
		if err != nil {
			if tce, ok := errors.AsType[*types.TransactionCanceledException](err); ok && conditionFailed(tce) {
				return nil // requeued or purged meanwhile
			}
			return s.translate(ctx, "requeue", err)
		}
		moved.Add(1)
		s.forgetHeld(moves[i].bucket)
		s.hub.Notify(moves[i].bucket)
		return nil
	})
	return int(moved.Load()), err
}

// Purge deletes the given envelopes, pending or parked, and returns how many items it
// deleted. DynamoDB cannot look an envelope up by ID without an index, so Purge reads
// every bucket's pending and parked partitions (keys and IDs only): its cost grows
// with the backlog. It is an operator's tool, not a hot path.
func (s driverStore) Purge(ctx context.Context, ids ...uuid.UUID) (int, error) {
	if err := s.enter(ctx); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	want := idSet(ids)
	pks := make([]string, 0, 2*s.cfg.BucketCount)
	for b := range s.cfg.BucketCount {
		pks = append(pks, s.keys.messages(b))
	}
	for b := range s.cfg.BucketCount {
		pks = append(pks, s.keys.parked(b))
	}
	var deletes []types.WriteRequest
	err := s.scanPartitions(ctx, "purge", pks, aws.String("#pk, #sk, #id"), map[string]string{"#sk": s.keys.sk, "#id": attrMessageID},
		func(_ int, item map[string]types.AttributeValue) {
			if _, ok := want[stringAttr(item, attrMessageID)]; ok {
				deletes = append(deletes, types.WriteRequest{DeleteRequest: &types.DeleteRequest{
					Key: s.keys.key(stringAttr(item, s.keys.pk), stringAttr(item, s.keys.sk)),
				}})
			}
		})
	if err != nil || len(deletes) == 0 {
		return 0, err
	}
	chunks := (len(deletes) + maxBatchWrite - 1) / maxBatchWrite
	err = s.forEach(ctx, chunks, func(ctx context.Context, i int) error {
		return s.batchWrite(ctx, "purge", deletes[i*maxBatchWrite:min((i+1)*maxBatchWrite, len(deletes))])
	})
	if err != nil {
		return 0, err
	}
	return len(deletes), nil
}

// Stats samples the backlog: per bucket, the CreatedAtUtc of the bucket's head (a
// one-item query), then, if there is one, a count of the pending messages after it,
// so that the whole count is capped at PendingCountLimit (a Select=COUNT query,
// billed as a read of every item counted), and the parked messages, capped per bucket
// the same way. An empty bucket costs two queries (its head and its parked count), a
// bucket with messages three. Sample from one relay only (the relay lets the owner of
// bucket zero do it), so the cost does not grow with the fleet.
func (s driverStore) Stats(ctx context.Context) (driver.Backlog, error) {
	if err := s.enter(ctx); err != nil {
		return driver.Backlog{}, err
	}
	n := s.cfg.BucketCount
	st := driver.Backlog{Pending: make([]int, n), PendingLimit: s.cfg.PendingCountLimit}
	heads := make([]time.Time, n)
	parked := make([]int, n)
	err := s.forEach(ctx, 2*n, func(ctx context.Context, i int) error {
		b := i % n
		if i >= n {
			count, err := s.count(ctx, s.keys.parked(b), nil, s.cfg.PendingCountLimit)
			parked[b] = count
			return err
		}
		out, err := s.client.Query(ctx, &ddb.QueryInput{
			TableName:                 aws.String(s.cfg.TableName),
			KeyConditionExpression:    aws.String("#pk = :pk"),
			ExpressionAttributeNames:  map[string]string{"#pk": s.keys.pk, "#created": attrCreatedAt},
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: s.keys.messages(b)}},
			ProjectionExpression:      aws.String("#created"),
			Limit:                     aws.Int32(1),
		})
		if err != nil {
			return s.translate(ctx, "stats", err)
		}
		if len(out.Items) == 0 {
			return nil
		}
		if heads[b], err = ticksOf(out.Items[0], attrCreatedAt); err != nil {
			return err
		}
		st.Pending[b] = 1
		if len(out.LastEvaluatedKey) == 0 {
			return nil
		}
		rest, err := s.count(ctx, s.keys.messages(b), out.LastEvaluatedKey, s.cfg.PendingCountLimit-1)
		st.Pending[b] += rest
		return err
	})
	if err != nil {
		return driver.Backlog{}, err
	}
	for b := range n {
		st.Parked += parked[b]
		if !heads[b].IsZero() && (st.OldestPending.IsZero() || heads[b].Before(st.OldestPending)) {
			st.OldestPending = heads[b]
		}
	}
	return st, nil
}

// count counts a partition's items after start (nil: from the first) up to limit.
func (s *Store) count(ctx context.Context, pk string, start map[string]types.AttributeValue, limit int) (int, error) {
	total := 0
	for total < limit {
		out, err := s.client.Query(ctx, &ddb.QueryInput{
			TableName:                 aws.String(s.cfg.TableName),
			KeyConditionExpression:    aws.String("#pk = :pk"),
			ExpressionAttributeNames:  map[string]string{"#pk": s.keys.pk},
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: pk}},
			Select:                    types.SelectCount,
			Limit:                     aws.Int32(int32(limit - total)),
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return 0, s.translate(ctx, "stats", err)
		}
		total += int(out.Count)
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	return min(total, limit), nil
}
