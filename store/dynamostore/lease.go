package dynamostore

import (
	"context"
	"errors"
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
// buckets beyond the bucket count are ignored. An item that cannot be read (a lease
// sort key that is not LEASE# and ten digits, a relay item without an id, an
// attribute of the wrong type) is left out and reported (see skipMalformed): one
// damaged or foreign item must not stop the fleet's coordination.
func (s driverStore) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	if err := s.enter(ctx); err != nil {
		return driver.Coordination{}, err
	}
	var (
		c          driver.Coordination
		start      map[string]types.AttributeValue
		unreadable = map[int]bool{}
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
				s.skipMalformed(stringAttr(item, s.keys.sk), err)
				if u, ok := errors.AsType[unreadableLease](err); ok {
					unreadable[u.bucket] = true
				}
			}
		}
		if len(out.LastEvaluatedKey) == 0 {
			break
		}
		start = out.LastEvaluatedKey
	}
	s.mu.Lock()
	s.unreadable = unreadable
	s.mu.Unlock()
	slices.SortFunc(c.Leases, func(a, b driver.Lease) int { return a.Bucket - b.Bucket })
	slices.SortFunc(c.Relays, func(a, b driver.RelayRecord) int { return strings.Compare(a.ID, b.ID) })
	return c, nil
}

// unreadableLease is why the lease item of a bucket in range cannot be read: an Owner
// or ExpiresAtUtc of the wrong type, or an Owner without an expiry. Such a bucket reads
// as free, and Claim takes it over (see Claim).
type unreadableLease struct {
	bucket int
	err    error
}

func (e unreadableLease) Error() string { return e.err.Error() }

// decodeCoordination adds one item of the coordination partition to c, or returns
// why it cannot be read. Items that are neither leases nor relay records are ignored.
func (s *Store) decodeCoordination(item map[string]types.AttributeValue, c *driver.Coordination) error {
	sk := stringAttr(item, s.keys.sk)
	switch {
	case strings.HasPrefix(sk, leaseSKPrefix):
		bucket, err := strconv.Atoi(strings.TrimPrefix(sk, leaseSKPrefix))
		if err != nil || bucket < 0 || leaseSortKey(bucket) != sk {
			return fmt.Errorf("dynamostore: lease item %q: the sort key is not %s and a 10-digit bucket number", sk, leaseSKPrefix)
		}
		if bucket >= s.cfg.BucketCount {
			return nil // left by a fleet with more buckets
		}
		owner, owned := item[attrOwner]
		exp, hasExp := item[attrExpiresAt]
		switch {
		case owned && !isString(owner):
			return unreadableLease{bucket, fmt.Errorf("dynamostore: lease item %q: attribute %s is not a string", sk, attrOwner)}
		case hasExp && !isNumber(exp), owned && !hasExp:
			return unreadableLease{bucket, fmt.Errorf("dynamostore: lease item %q: attribute %s is missing or not a number", sk, attrExpiresAt)}
		}
		expires, err := numberTicks(item, attrExpiresAt)
		if err != nil {
			return fmt.Errorf("dynamostore: lease item %q: %w", sk, err)
		}
		c.Leases = append(c.Leases, driver.Lease{Bucket: bucket, Owner: stringAttr(item, attrOwner), ExpiresAt: expires})
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
// record written before relays stored it) reads as 0, unknown; an absent LastSeenUtc
// (a record left by an older version) as the zero time, which makes the record stale
// for peers, who delete it (see DeleteRelay).
func decodeRelay(sk string, item map[string]types.AttributeValue) (driver.RelayRecord, error) {
	r := driver.RelayRecord{ID: strings.TrimPrefix(sk, relaySKPrefix)}
	if r.ID == "" {
		return r, fmt.Errorf("dynamostore: relay item %q: no relay id after %s", sk, relaySKPrefix)
	}
	var err error
	if r.LastSeen, err = numberTicks(item, attrLastSeen); err != nil {
		return r, fmt.Errorf("dynamostore: relay item %q: %w", sk, err)
	}
	if r.StoppedAt, err = numberTicks(item, attrStoppedAt); err != nil {
		return r, fmt.Errorf("dynamostore: relay item %q: %w", sk, err)
	}
	n, err := number(item, attrBucketCount)
	if err != nil {
		return r, fmt.Errorf("dynamostore: relay item %q: %w", sk, err)
	}
	r.BucketCount = int(n)
	if r.Instance, err = decodeInstance(item); err != nil {
		return r, fmt.Errorf("dynamostore: relay item %q: %w", sk, err)
	}
	return r, nil
}

// instanceAttr is the Instance map of a relay record.
func instanceAttr(i driver.Instance) types.AttributeValue {
	return &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
		instanceHostKey:  &types.AttributeValueMemberS{Value: i.Host},
		instancePIDKey:   numberAttr(int64(i.PID)),
		instanceNonceKey: &types.AttributeValueMemberS{Value: i.Nonce},
	}}
}

// decodeInstance reads a relay record's optional Instance map: the zero instance
// (unknown) when absent, as on records written before relays stored it.
func decodeInstance(item map[string]types.AttributeValue) (driver.Instance, error) {
	v, ok := item[attrInstance]
	if !ok {
		return driver.Instance{}, nil
	}
	m, ok := v.(*types.AttributeValueMemberM)
	if !ok {
		return driver.Instance{}, fmt.Errorf("attribute %s is not a map", attrInstance)
	}
	host, okHost := m.Value[instanceHostKey].(*types.AttributeValueMemberS)
	nonce, okNonce := m.Value[instanceNonceKey].(*types.AttributeValueMemberS)
	if !okHost || !okNonce {
		return driver.Instance{}, fmt.Errorf("attribute %s lacks the string %s or %s", attrInstance, instanceHostKey, instanceNonceKey)
	}
	pid, err := number(m.Value, instancePIDKey)
	if err != nil {
		return driver.Instance{}, fmt.Errorf("attribute %s: %w", attrInstance, err)
	}
	return driver.Instance{Host: host.Value, PID: int(pid), Nonce: nonce.Value}, nil
}

// number reads an optional number attribute: 0 when absent, an error when it holds
// another type or no integer.
func number(item map[string]types.AttributeValue, name string) (int64, error) {
	v, ok := item[name]
	if !ok {
		return 0, nil
	}
	if !isNumber(v) {
		return 0, fmt.Errorf("attribute %s is not a number", name)
	}
	n, _, err := intAttr(item, name)
	if err != nil {
		return 0, fmt.Errorf("attribute %s: %w", name, err)
	}
	return n, nil
}

// numberTicks reads an optional ticks attribute as number does: the zero time when
// absent.
func numberTicks(item map[string]types.AttributeValue, name string) (time.Time, error) {
	if _, ok := item[name]; !ok {
		return time.Time{}, nil
	}
	n, err := number(item, name)
	if err != nil {
		return time.Time{}, err
	}
	return fromTicks(n), nil
}

// maxReported bounds how many malformed coordination items a store remembers having
// reported.
const maxReported = 1000

// skipMalformed reports a coordination item that ReadCoordination or ReadRelays
// leaves out because it cannot be read: a WARN naming the item and what is wrong with
// it, once per item for the life of the store (for up to maxReported items), so an
// item that stays costs a map lookup per read, not a log line per round.
func (s *Store) skipMalformed(sk string, err error) {
	s.mu.Lock()
	first := !s.reported[sk] && len(s.reported) < maxReported
	if first {
		s.reported[sk] = true
	}
	s.mu.Unlock()
	if first {
		s.log.Warn("dynamostore: skipping a malformed coordination item; relays ignore it until it is fixed or deleted",
			"partition_key", s.keys.coordination(), "sort_key", sk, "error", err)
	}
}

// ReadRelays reads the relay records with one eventually consistent Query of the
// coordination partition, limited by its key condition to the sort keys that begin
// with RELAY#, so no lease item is read or paid for; the projection trims the
// response, not the charge. A Query is charged for the size of the items it reads,
// rounded up to 4 KB, at half a read unit per 4 KB when eventually consistent. A
// relay item is about 135 bytes plus its ID and host name, so a fleet of up to about
// 20 relays costs 0.5 read units a call. Relay items that cannot be read are left out and
// reported, as by ReadCoordination.
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
			ProjectionExpression:   aws.String("#sk, #seen, #stopped, #count, #inst"),
			ExpressionAttributeNames: map[string]string{
				"#pk": s.keys.pk, "#sk": s.keys.sk,
				"#seen": attrLastSeen, "#stopped": attrStoppedAt, "#count": attrBucketCount, "#inst": attrInstance,
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
			sk := stringAttr(item, s.keys.sk)
			r, err := decodeRelay(sk, item)
			if err != nil {
				s.skipMalformed(sk, err)
				continue
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

// Heartbeat writes the relay's record with LastSeenUtc=at, BucketCount=bucketCount,
// the Instance map (unless instance is zero) and no StoppedAtUtc, only if the stored
// LastSeenUtc is earlier: a heartbeat the relay
// gave up on cannot land later and put an older round back. The record is written
// whole (a conditional PutItem), which is how the stop stamp goes away when the relay
// runs again under the same ID (see StopRelay for when that can be). The store
// remembers the latest at it sent for the relay, landed or not, for StopRelay.
func (s driverStore) Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int, instance driver.Instance) (bool, error) {
	if err := checkRelayID(relay); err != nil {
		return false, err
	}
	if len(instance.Host) > driver.MaxInstanceHost || len(instance.Nonce) > driver.MaxInstanceNonce {
		return false, fmt.Errorf("%w: dynamostore: relay instance host (%d bytes) or nonce (%d bytes) is longer than %d or %d bytes",
			outbox.ErrMisconfigured, len(instance.Host), len(instance.Nonce), driver.MaxInstanceHost, driver.MaxInstanceNonce)
	}
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	s.mu.Lock()
	if at.After(s.beats[relay]) {
		s.beats[relay] = at
	}
	s.mu.Unlock()
	item := s.keys.key(s.keys.coordination(), relaySortKey(relay))
	item[attrLastSeen] = ticksAttr(at)
	item[attrBucketCount] = numberAttr(int64(bucketCount))
	if !instance.IsZero() {
		item[attrInstance] = instanceAttr(instance)
	}
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

// StopRelay stamps the relay's record StoppedAtUtc=at and moves its LastSeenUtc
// forward to seen, the later of at and the latest heartbeat this store sent for the
// relay (landed or not), if the stored one is earlier. The record stays; peers delete
// it later (DeleteRelay). Every record it writes has LastSeenUtc, which that deletion
// is conditioned on.
//
// The stamp survives every heartbeat of the run that stopped: each of them is dated
// no later than seen, and a heartbeat lands only if it moves LastSeenUtc forward. That
// includes a heartbeat the relay abandoned that lands after the stop, even one dated
// after at because the clock was set back while it was in flight. The stamp is
// cleared only by a heartbeat dated after seen: a relay that runs again under the same
// ID, once its clock has passed seen, which is the rule every heartbeat follows (a
// relay whose clock is behind its record waits for it to catch up).
func (s driverStore) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if err := checkRelayID(relay); err != nil {
		return err
	}
	if err := s.enter(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	seen := at
	if b := s.beats[relay]; b.After(seen) {
		seen = b
	}
	s.mu.Unlock()
	key := s.keys.key(s.keys.coordination(), relaySortKey(relay))
	names := map[string]string{"#seen": attrLastSeen, "#stopped": attrStoppedAt}
	values := map[string]types.AttributeValue{":at": ticksAttr(at), ":seen": ticksAttr(seen)}
	for range 2 {
		// The usual case: the stored heartbeat is earlier, one write does both (and
		// writes a whole record if there is none).
		ok, err := s.conditional(ctx, "stop relay", &ddb.UpdateItemInput{
			Key:                       key,
			UpdateExpression:          aws.String("SET #seen = :seen, #stopped = :at"),
			ConditionExpression:       aws.String("attribute_not_exists(#seen) OR #seen < :seen"),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: values,
		})
		if err != nil || ok {
			return err
		}
		// The record carries a heartbeat no earlier than seen: stamp the stop alone,
		// only on a record that has LastSeenUtc, so this write can never create a
		// record the cleanup (conditional on LastSeenUtc) could not delete. If a peer
		// deleted the record meanwhile, the first write runs again.
		ok, err = s.conditional(ctx, "stop relay", &ddb.UpdateItemInput{
			Key:                       key,
			UpdateExpression:          aws.String("SET #stopped = :at"),
			ConditionExpression:       aws.String("attribute_exists(#seen)"),
			ExpressionAttributeNames:  names,
			ExpressionAttributeValues: map[string]types.AttributeValue{":at": values[":at"]},
		})
		if err != nil || ok {
			return err
		}
	}
	return nil // deleted twice while stopping: a record nobody keeps needs no stamp
}

// DeleteRelay deletes a relay record only if its LastSeenUtc still equals lastSeen.
// The zero lastSeen is how a record without LastSeenUtc reads (one left by an older
// version): it is deleted if it still has none (or tick 0), so such a record is
// deleted by the first cleanup that finds it instead of drawing a refused delete
// every round.
func (s driverStore) DeleteRelay(ctx context.Context, relay string, lastSeen time.Time) (bool, error) {
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	in := &ddb.DeleteItemInput{
		TableName:                 aws.String(s.cfg.TableName),
		Key:                       s.keys.key(s.keys.coordination(), relaySortKey(relay)),
		ConditionExpression:       aws.String("#seen = :seen"),
		ExpressionAttributeNames:  map[string]string{"#seen": attrLastSeen},
		ExpressionAttributeValues: map[string]types.AttributeValue{":seen": ticksAttr(lastSeen)},
	}
	if lastSeen.IsZero() {
		in.ConditionExpression = aws.String("attribute_not_exists(#seen) OR #seen = :seen")
	}
	_, err := s.client.DeleteItem(ctx, in)
	switch {
	case err == nil:
		return true, nil
	case isConditionFailed(err):
		return false, nil
	}
	return false, s.translate(ctx, "delete relay", err)
}

// Claim takes bucket for owner until expiresAt, only if the lease item is absent, has
// no Owner, or expired at now. A lease item that the last ReadCoordination could not
// read (an Owner that is not a string, an ExpiresAtUtc that is missing or not a
// number) read as free, and is claimed only if it still has no Owner or is still
// unreadable in that way: no relay can hold such a lease (none could renew it), and
// the claim repairs the item. A successful claim starts gap probing of the bucket from
// its start again.
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
	in := &ddb.UpdateItemInput{
		Key:                      s.keys.key(s.keys.coordination(), leaseSortKey(bucket)),
		UpdateExpression:         aws.String("SET #owner = :owner, #exp = :exp"),
		ConditionExpression:      aws.String("attribute_not_exists(#owner) OR #exp <= :now"),
		ExpressionAttributeNames: map[string]string{"#owner": attrOwner, "#exp": attrExpiresAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":owner": &types.AttributeValueMemberS{Value: owner},
			":exp":   ticksAttr(expiresAt),
			":now":   ticksAttr(now),
		},
	}
	s.mu.Lock()
	repair := s.unreadable[bucket]
	s.mu.Unlock()
	if repair {
		// No comparison with the stored expiry, which may not be a number.
		in.ConditionExpression = aws.String("attribute_not_exists(#owner) OR NOT attribute_type(#owner, :string) OR NOT attribute_type(#exp, :number)")
		delete(in.ExpressionAttributeValues, ":now")
		in.ExpressionAttributeValues[":string"] = &types.AttributeValueMemberS{Value: string(types.ScalarAttributeTypeS)}
		in.ExpressionAttributeValues[":number"] = &types.AttributeValueMemberS{Value: string(types.ScalarAttributeTypeN)}
	}
	ok, err := s.conditional(ctx, "claim", in)
	if ok {
		s.forgetRemoved(bucket)
		s.holdZero(bucket, expiresAt)
		s.mu.Lock()
		delete(s.unreadable, bucket)
		s.mu.Unlock()
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
