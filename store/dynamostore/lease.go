package dynamostore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

var errNoRelayID = fmt.Errorf("%w: dynamostore: relay id is empty; give every relay an id (relay.Config.RelayID)", outbox.ErrMisconfigured)

// checkRelayID refuses a relay id that cannot be stored: empty, not UTF-8, or too long
// for the sort key of its relay record.
func checkRelayID(relay string) error {
	switch {
	case relay == "":
		return errNoRelayID
	case len(relay) > maxRelayID:
		return fmt.Errorf("%w: dynamostore: relay id is %d bytes; DynamoDB limits a sort key value to %d bytes, which leaves at most %d for the id: shorten it (relay.Config.RelayID)",
			outbox.ErrMisconfigured, len(relay), maxSortKey, maxRelayID)
	case !utf8.ValidString(relay):
		return fmt.Errorf("%w: dynamostore: relay id %q is not valid UTF-8, which a string key must be (relay.Config.RelayID)", outbox.ErrMisconfigured, relay)
	}
	return nil
}

// ReadCoordination reads every lease and relay heartbeat with one strongly consistent
// Query of the coordination partition (paged if it passes 1 MB). Lease items of
// buckets beyond the bucket count are ignored.
func (s driverStore) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	if err := s.enter(ctx); err != nil {
		return driver.Coordination{}, err
	}
	var (
		c     driver.Coordination
		start map[string]types.AttributeValue
	)
	for {
		out, err := s.client.Query(ctx, &ddb.QueryInput{
			TableName:                 aws.String(s.cfg.TableName),
			KeyConditionExpression:    aws.String("#pk = :pk"),
			ExpressionAttributeNames:  map[string]string{"#pk": s.keys.pk},
			ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: s.keys.coordination()}},
			ConsistentRead:            aws.Bool(true),
			ExclusiveStartKey:         start,
		})
		if err != nil {
			return driver.Coordination{}, s.translate(ctx, "read coordination", err)
		}
		for _, item := range out.Items {
			if err := s.decodeCoordination(item, &c); err != nil {
				return driver.Coordination{}, err
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	slices.SortFunc(c.Leases, func(a, b driver.Lease) int { return a.Bucket - b.Bucket })
	slices.SortFunc(c.Relays, func(a, b driver.RelayRecord) int { return strings.Compare(a.ID, b.ID) })
	return c, nil
}

func (s *Store) decodeCoordination(item map[string]types.AttributeValue, c *driver.Coordination) error {
	sk := stringAttr(item, s.keys.sk)
	switch {
	case strings.HasPrefix(sk, leaseSKPrefix):
		bucket, err := strconv.Atoi(strings.TrimPrefix(sk, leaseSKPrefix))
		if err != nil {
			return fmt.Errorf("dynamostore: lease item %q: %w", sk, err)
		}
		if bucket < 0 || bucket >= s.cfg.BucketCount {
			return nil // left by a fleet with more buckets
		}
		exp, err := ticksOf(item, attrExpiresAt)
		if err != nil {
			return fmt.Errorf("dynamostore: lease item %q: %w", sk, err)
		}
		c.Leases = append(c.Leases, driver.Lease{Bucket: bucket, Owner: stringAttr(item, attrOwner), ExpiresAt: exp})
	case strings.HasPrefix(sk, relaySKPrefix):
		r, err := decodeRelay(sk, item)
		if err != nil {
			return err
		}
		c.Relays = append(c.Relays, r)
	}
	return nil
}

// decodeRelay reads a relay item whose sort key is sk. An absent BucketCount (a
// record written before relays stored it) reads as 0, unknown.
func decodeRelay(sk string, item map[string]types.AttributeValue) (driver.RelayRecord, error) {
	r := driver.RelayRecord{ID: strings.TrimPrefix(sk, relaySKPrefix)}
	var err error
	if r.LastSeen, err = ticksOf(item, attrLastSeen); err != nil {
		return r, fmt.Errorf("dynamostore: relay item %q: %w", sk, err)
	}
	if r.StoppedAt, err = ticksOf(item, attrStoppedAt); err != nil {
		return r, fmt.Errorf("dynamostore: relay item %q: %w", sk, err)
	}
	n, _, err := intAttr(item, attrBucketCount)
	if err != nil {
		return r, fmt.Errorf("dynamostore: relay item %q: %w", sk, err)
	}
	r.BucketCount = int(n)
	return r, nil
}

// ReadRelays reads the relay records with one eventually consistent Query of the
// coordination partition, limited by its key condition to the sort keys that begin
// with RELAY#, so no lease item is read or paid for; the projection trims the
// response, not the charge. A Query is charged for the size of the items it reads,
// rounded up to 4 KB, at half a read unit per 4 KB when eventually consistent. A
// relay item is about 65 bytes plus its ID, so a fleet of up to about 30 relays
// costs 0.5 read units a call.
func (s driverStore) ReadRelays(ctx context.Context) ([]driver.RelayRecord, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	var (
		out   []driver.RelayRecord
		start map[string]types.AttributeValue
	)
	for {
		q, err := s.client.Query(ctx, &ddb.QueryInput{
			TableName:              aws.String(s.cfg.TableName),
			KeyConditionExpression: aws.String("#pk = :pk AND begins_with(#sk, :relay)"),
			ProjectionExpression:   aws.String("#sk, #seen, #stopped, #count"),
			ExpressionAttributeNames: map[string]string{
				"#pk": s.keys.pk, "#sk": s.keys.sk,
				"#seen": attrLastSeen, "#stopped": attrStoppedAt, "#count": attrBucketCount,
			},
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":pk":    &types.AttributeValueMemberS{Value: s.keys.coordination()},
				":relay": &types.AttributeValueMemberS{Value: relaySKPrefix},
			},
			ConsistentRead:    aws.Bool(false),
			ExclusiveStartKey: start,
		})
		if err != nil {
			return nil, s.translate(ctx, "read relays", err)
		}
		for _, item := range q.Items {
			r, err := decodeRelay(stringAttr(item, s.keys.sk), item)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		// Pages only past 1 MB of relay items, which no fleet reaches.
		if len(q.LastEvaluatedKey) == 0 {
			break
		}
		start = q.LastEvaluatedKey
	}
	slices.SortFunc(out, func(a, b driver.RelayRecord) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// conditional sends one conditional UpdateItem and reports whether its condition held.
func (s *Store) conditional(ctx context.Context, op string, in *ddb.UpdateItemInput) (bool, error) {
	in.TableName = aws.String(s.cfg.TableName)
	_, err := s.client.UpdateItem(ctx, in)
	switch {
	case err == nil:
		return true, nil
	case isConditionFailed(err):
		return false, nil
	}
	return false, s.translate(ctx, op, err)
}

// Heartbeat writes the relay's record with LastSeenUtc=at, BucketCount=bucketCount and
// no StoppedAtUtc, only if the stored LastSeenUtc is earlier: a heartbeat the relay
// gave up on cannot land later and put an older round back. The record is written
// whole (a conditional PutItem), which is how the stop stamp goes away on a restart
// under the same ID.
func (s driverStore) Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int) (bool, error) {
	if err := checkRelayID(relay); err != nil {
		return false, err
	}
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	item := s.keys.key(s.keys.coordination(), relaySortKey(relay))
	item[attrLastSeen] = ticksAttr(at)
	item[attrBucketCount] = numberAttr(int64(bucketCount))
	return s.conditionalPut(ctx, "heartbeat", &ddb.PutItemInput{
		Item:                      item,
		ConditionExpression:       aws.String("attribute_not_exists(#seen) OR #seen < :at"),
		ExpressionAttributeNames:  map[string]string{"#seen": attrLastSeen},
		ExpressionAttributeValues: map[string]types.AttributeValue{":at": ticksAttr(at)},
	})
}

// conditionalPut sends one conditional PutItem and reports whether its condition held.
func (s *Store) conditionalPut(ctx context.Context, op string, in *ddb.PutItemInput) (bool, error) {
	in.TableName = aws.String(s.cfg.TableName)
	_, err := s.client.PutItem(ctx, in)
	switch {
	case err == nil:
		return true, nil
	case isConditionFailed(err):
		return false, nil
	}
	return false, s.translate(ctx, op, err)
}

// StopRelay stamps the relay's record StoppedAtUtc=at, and LastSeenUtc=at when that is
// later than the stored one, so a heartbeat the relay abandoned cannot revive it. The
// record stays; peers delete it later (DeleteRelay). Every record it writes
// has LastSeenUtc, which that deletion is conditioned on.
func (s driverStore) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if err := checkRelayID(relay); err != nil {
		return err
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	key := s.keys.key(s.keys.coordination(), relaySortKey(relay))
	names := map[string]string{"#seen": attrLastSeen, "#stopped": attrStoppedAt}
	values := map[string]types.AttributeValue{":at": ticksAttr(at)}
	for range 2 {
		// The usual case: the stop is later than the last heartbeat, one write does
		// both (and writes a whole record if there is none).
		ok, err := s.conditional(ctx, "stop relay", &ddb.UpdateItemInput{
			Key:                       key,
			UpdateExpression:          aws.String("SET #seen = :at, #stopped = :at"),
			ConditionExpression:       aws.String("attribute_not_exists(#seen) OR #seen < :at"),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: values,
		})
		if err != nil || ok {
			return err
		}
		// The record carries a later heartbeat: stamp the stop alone, only on a
		// record that has LastSeenUtc, so this write can never create a record the
		// cleanup (conditional on LastSeenUtc) could not delete. If a peer deleted the
		// record meanwhile, the first write runs again.
		ok, err = s.conditional(ctx, "stop relay", &ddb.UpdateItemInput{
			Key:                       key,
			UpdateExpression:          aws.String("SET #stopped = :at"),
			ConditionExpression:       aws.String("attribute_exists(#seen)"),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: values,
		})
		if err != nil || ok {
			return err
		}
	}
	return nil // deleted twice while stopping: a record nobody keeps needs no stamp
}

// DeleteRelay deletes a relay record only if its LastSeenUtc still equals lastSeen.
func (s driverStore) DeleteRelay(ctx context.Context, relay string, lastSeen time.Time) (bool, error) {
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	_, err := s.client.DeleteItem(ctx, &ddb.DeleteItemInput{
		TableName:                 aws.String(s.cfg.TableName),
		Key:                       s.keys.key(s.keys.coordination(), relaySortKey(relay)),
		ConditionExpression:       aws.String("#seen = :seen"),
		ExpressionAttributeNames:  map[string]string{"#seen": attrLastSeen},
		ExpressionAttributeValues: map[string]types.AttributeValue{":seen": ticksAttr(lastSeen)},
	})
	switch {
	case err == nil:
		return true, nil
	case isConditionFailed(err):
		return false, nil
	}
	return false, s.translate(ctx, "delete relay", err)
}

// Claim takes bucket for owner until expiresAt, only if the lease item is absent, has
// no Owner, or expired at now. A successful claim starts gap probing of the bucket
// from its start again.
func (s driverStore) Claim(ctx context.Context, bucket int, owner string, now, expiresAt time.Time) (bool, error) {
	if err := s.checkBucket(bucket); err != nil {
		return false, err
	}
	if err := checkRelayID(owner); err != nil {
		return false, err
	}
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	ok, err := s.conditional(ctx, "claim", &ddb.UpdateItemInput{
		Key:                      s.keys.key(s.keys.coordination(), leaseSortKey(bucket)),
		UpdateExpression:         aws.String("SET #owner = :owner, #exp = :exp"),
		ConditionExpression:      aws.String("attribute_not_exists(#owner) OR #exp <= :now"),
		ExpressionAttributeNames: map[string]string{"#owner": attrOwner, "#exp": attrExpiresAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":owner": &types.AttributeValueMemberS{Value: owner},
			":exp":   ticksAttr(expiresAt),
			":now":   ticksAttr(now),
		},
	})
	if ok {
		s.forgetRemoved(bucket)
		s.holdZero(bucket, expiresAt)
	}
	return ok, err
}

// Renew extends held to expiresAt, only if the stored lease still names held.Owner
// with expiry held.ExpiresAt and has not expired at now. A renewal that would not move
// the expiry forward is refused without a request.
func (s driverStore) Renew(ctx context.Context, held driver.Lease, now, expiresAt time.Time) (bool, error) {
	if err := s.checkBucket(held.Bucket); err != nil {
		return false, err
	}
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	if held.Owner == "" || !expiresAt.After(held.ExpiresAt) {
		return false, nil
	}
	ok, err := s.conditional(ctx, "renew", &ddb.UpdateItemInput{
		Key:                      s.keys.key(s.keys.coordination(), leaseSortKey(held.Bucket)),
		UpdateExpression:         aws.String("SET #exp = :exp"),
		ConditionExpression:      aws.String("#owner = :owner AND #exp = :held AND #exp > :now"),
		ExpressionAttributeNames: map[string]string{"#owner": attrOwner, "#exp": attrExpiresAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":owner": &types.AttributeValueMemberS{Value: held.Owner},
			":held":  ticksAttr(held.ExpiresAt),
			":exp":   ticksAttr(expiresAt),
			":now":   ticksAttr(now),
		},
	})
	if ok {
		s.holdZero(held.Bucket, expiresAt)
	}
	return ok, err
}

// Release frees held, only if the stored lease still names held.Owner with expiry
// held.ExpiresAt. It rewrites the lease item whole without Owner (a conditional
// PutItem); the expiry stays as a record.
func (s driverStore) Release(ctx context.Context, held driver.Lease) (bool, error) {
	if err := s.checkBucket(held.Bucket); err != nil {
		return false, err
	}
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	if held.Owner == "" {
		return false, nil
	}
	item := s.keys.key(s.keys.coordination(), leaseSortKey(held.Bucket))
	item[attrExpiresAt] = ticksAttr(held.ExpiresAt)
	ok, err := s.conditionalPut(ctx, "release", &ddb.PutItemInput{
		Item:                     item,
		ConditionExpression:      aws.String("#owner = :owner AND #exp = :held"),
		ExpressionAttributeNames: map[string]string{"#owner": attrOwner, "#exp": attrExpiresAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":owner": &types.AttributeValueMemberS{Value: held.Owner},
			":held":  ticksAttr(held.ExpiresAt),
		},
	})
	if ok {
		s.forgetRemoved(held.Bucket)
		s.holdZero(held.Bucket, time.Time{})
	}
	return ok, err
}

// forgetRemoved makes the next fetch of bucket probe gaps from the bucket's start: the
// bucket changed hands, so what this store removed says nothing about the head.
func (s *Store) forgetRemoved(bucket int) {
	s.mu.Lock()
	s.lastRemoved[bucket] = 0
	s.heads[bucket] = nil
	s.ahead[bucket] = ahead{}
	s.mu.Unlock()
}

// holdZero records the expiry of bucket zero's lease held through this store.
func (s *Store) holdZero(bucket int, until time.Time) {
	if bucket != 0 {
		return
	}
	s.mu.Lock()
	s.zeroUntil = until
	s.mu.Unlock()
}

// SampleBacklog samples the backlog as Stats does, only when the relay using this
// store holds bucket zero's lease (claimed or renewed through this store, not yet
// expired), and otherwise returns false without a request ([driver.BacklogSampler]).
// Every instance may call it from its metrics loop: exactly one instance pays for the
// sample, so the cost does not grow with the fleet.
func (s driverStore) SampleBacklog(ctx context.Context) (driver.Backlog, bool, error) {
	s.mu.Lock()
	held := time.Now().Before(s.zeroUntil)
	s.mu.Unlock()
	if !held {
		return driver.Backlog{}, false, nil
	}
	st, err := s.Stats(ctx)
	return st, err == nil, err
}
