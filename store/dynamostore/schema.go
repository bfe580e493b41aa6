package dynamostore

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox/driver"
)

// Attribute names of the items the store writes. The first block is what every
// writer puts in a message item; the second block is what the relay adds after a
// failed publish or when it parks a message; then the counter, lease and relay
// attributes.
const (
	attrMessageID   = "MessageId"
	attrTopic       = "Topic"
	attrKey         = "Key"
	attrValue       = "Value"
	attrHeaders     = "Headers"
	attrPartition   = "Partition"
	attrCreatedAt   = "CreatedAtUtc"
	attrBucketCount = "BucketCount"

	attrAttempts      = "Attempts"
	attrNextAttemptAt = "NextAttemptAtUtc"
	attrLastError     = "LastError"
	attrParkedAt      = "ParkedAtUtc"

	attrSequence  = "Sequence"
	attrOwner     = "Owner"
	attrExpiresAt = "ExpiresAtUtc"
	attrLastSeen  = "LastSeenUtc"
	attrStoppedAt = "StoppedAtUtc"
	// attrInstance is a relay record's map of the instance that wrote its last
	// heartbeat (driver.Instance), with the keys below.
	attrInstance     = "Instance"
	instanceHostKey  = "Host"
	instancePIDKey   = "Pid"
	instanceNonceKey = "Nonce"
)

const (
	sequenceSortKey = "SEQUENCE"
	leaseSKPrefix   = "LEASE#"
	relaySKPrefix   = "RELAY#"
	// maxItemSize is DynamoDB's item size limit.
	maxItemSize = 400 * 1024
	// maxTransactItems and maxTransactSize are DynamoDB's TransactWriteItems limits.
	maxTransactItems = 100
	maxTransactSize  = 4 * 1024 * 1024
	// maxLastError bounds the LastError attribute so a long failure text cannot push an
	// item past maxItemSize.
	maxLastError = 2048
	// itemOverhead is what a message item needs besides the message's own bytes and
	// the key prefix and key attribute names: the rest of its keys, attribute names,
	// numbers and the header encoding's framing, with room to spare.
	itemOverhead = 1024
	// maxNumberSize bounds the stored size of a 64-bit number: 20 digits.
	maxNumberSize = (20+1)/2 + 1
	// failureRoom is what Reschedule and Park may add to a message item: Attempts,
	// NextAttemptAtUtc, LastError at its cap and ParkedAtUtc. A message item is
	// accepted only if it leaves this much room under maxItemSize, so every message
	// the store accepts can later be rescheduled and parked.
	failureRoom = len(attrAttempts) + maxNumberSize +
		len(attrNextAttemptAt) + maxNumberSize +
		len(attrLastError) + maxLastError +
		len(attrParkedAt) + maxNumberSize
	// maxWrittenItem is the largest message item a writer may put.
	maxWrittenItem = maxItemSize - failureRoom
	// maxPartitionKey and maxSortKey are DynamoDB's key value limits, in bytes.
	maxPartitionKey = 2048
	maxSortKey      = 1024
	// longestPKSuffix is the longest part of a partition key value after the prefix:
	// "#MESSAGES#" or "#SEQUENCE#" and a bucket number of up to 10 digits.
	longestPKSuffix = len("#MESSAGES#") + 10
	// maxKeyPrefix is the longest KeyPrefix whose partition keys fit DynamoDB's limit.
	maxKeyPrefix = maxPartitionKey - longestPKSuffix
	// maxRelayID is the longest relay id whose record's sort key fits DynamoDB's limit.
	maxRelayID = maxSortKey - len(relaySKPrefix)
)

// keys builds the key values of one outbox (one KeyPrefix).
type keys struct {
	prefix string
	pk, sk string // attribute names
}

func (k keys) messages(bucket int) string { return k.prefix + "#MESSAGES#" + strconv.Itoa(bucket) }
func (k keys) parked(bucket int) string   { return k.prefix + "#PARKED#" + strconv.Itoa(bucket) }
func (k keys) sequence(bucket int) string { return k.prefix + "#SEQUENCE#" + strconv.Itoa(bucket) }
func (k keys) coordination() string       { return k.prefix + "#COORDINATION" }

func seqSortKey(seq int64) string { return fmt.Sprintf("%019d", seq) }
func leaseSortKey(bucket int) string {
	return fmt.Sprintf("%s%010d", leaseSKPrefix, bucket)
}
func relaySortKey(relay string) string { return relaySKPrefix + relay }

func (k keys) key(pk, sk string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{
		k.pk: &types.AttributeValueMemberS{Value: pk},
		k.sk: &types.AttributeValueMemberS{Value: sk},
	}
}

// Times are stored as UTC ticks: 100 ns units since 0001-01-01T00:00:00Z (the
// package documentation's item schema). The zero time.Time is tick 0.
const unixEpochSeconds = 62135596800 // seconds from 0001-01-01 to 1970-01-01

func toTicks(t time.Time) int64 {
	return (t.Unix()+unixEpochSeconds)*10_000_000 + int64(t.Nanosecond()/100)
}

func fromTicks(ticks int64) time.Time {
	return time.Unix(ticks/10_000_000-unixEpochSeconds, (ticks%10_000_000)*100).UTC()
}

func numberAttr(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func ticksAttr(t time.Time) types.AttributeValue { return numberAttr(toTicks(t)) }

// messageItem is the stored form of env under partition key pk.
func (k keys) messageItem(env *driver.Envelope, pk string) map[string]types.AttributeValue {
	item := k.key(pk, seqSortKey(env.Seq))
	item[attrMessageID] = &types.AttributeValueMemberS{Value: env.ID.String()}
	item[attrTopic] = &types.AttributeValueMemberS{Value: env.Topic}
	if env.Key != nil {
		item[attrKey] = &types.AttributeValueMemberB{Value: env.Key}
	}
	if env.Payload != nil {
		item[attrValue] = &types.AttributeValueMemberB{Value: env.Payload}
	}
	if env.Headers != nil {
		item[attrHeaders] = &types.AttributeValueMemberB{Value: driver.EncodeHeaders(env.Headers)}
	}
	if env.Partition != nil {
		item[attrPartition] = numberAttr(int64(*env.Partition))
	}
	item[attrCreatedAt] = ticksAttr(env.CreatedAt)
	item[attrBucketCount] = numberAttr(int64(env.BucketCount))
	if env.Attempts > 0 {
		item[attrAttempts] = numberAttr(int64(env.Attempts))
	}
	if !env.NextAttemptAt.IsZero() {
		item[attrNextAttemptAt] = ticksAttr(env.NextAttemptAt)
	}
	if env.LastError != "" {
		item[attrLastError] = &types.AttributeValueMemberS{Value: env.LastError}
	}
	return item
}

// decodePending decodes a pending message item for the relay, which needs every
// attribute a writer must put: an item without MessageId, Topic or CreatedAtUtc (or
// with one of another type) fails with an error naming the attribute.
func (k keys) decodePending(item map[string]types.AttributeValue, bucket int) (*driver.Envelope, error) {
	for _, attr := range []struct {
		name string
		ok   bool
	}{
		{attrMessageID, isString(item[attrMessageID])},
		{attrTopic, isString(item[attrTopic]) && stringAttr(item, attrTopic) != ""},
		{attrCreatedAt, isNumber(item[attrCreatedAt])},
	} {
		if !attr.ok {
			return nil, fmt.Errorf("dynamostore: message item %s/%s: required attribute %s is missing, empty or not of its type (see the item schema in the package documentation)",
				stringAttr(item, k.pk), stringAttr(item, k.sk), attr.name)
		}
	}
	return k.decodeMessage(item, bucket, driver.Pending)
}

func isString(v types.AttributeValue) bool { _, ok := v.(*types.AttributeValueMemberS); return ok }
func isNumber(v types.AttributeValue) bool { _, ok := v.(*types.AttributeValueMemberN); return ok }

// decodeMessage turns a stored message item back into an envelope.
func (k keys) decodeMessage(item map[string]types.AttributeValue, bucket int, status driver.Status) (*driver.Envelope, error) {
	env := &driver.Envelope{Bucket: bucket, Status: status}
	var err error
	fail := func(attr string, cause error) error {
		return fmt.Errorf("dynamostore: message item %s/%s: attribute %s: %w", stringAttr(item, k.pk), stringAttr(item, k.sk), attr, cause)
	}
	if env.Seq, err = strconv.ParseInt(stringAttr(item, k.sk), 10, 64); err != nil {
		return nil, fail(k.sk, err)
	}
	if env.ID, err = uuid.Parse(stringAttr(item, attrMessageID)); err != nil && status != driver.Parked {
		// A parked item may be a malformed one that Fetch parked: list it anyway, with
		// a nil ID.
		return nil, fail(attrMessageID, err)
	}
	env.Topic = stringAttr(item, attrTopic)
	env.Key = binaryAttr(item, attrKey)
	env.Payload = binaryAttr(item, attrValue)
	if raw := binaryAttr(item, attrHeaders); raw != nil {
		if env.Headers, err = driver.DecodeHeaders(raw); err != nil {
			return nil, fail(attrHeaders, err)
		}
	}
	if n, ok, err := intAttr(item, attrPartition); err != nil {
		return nil, fail(attrPartition, err)
	} else if ok {
		if n < 0 || n > math.MaxInt32 {
			return nil, fail(attrPartition, fmt.Errorf("%d is not a partition number", n))
		}
		p := int32(n)
		env.Partition = &p
	}
	ticks, _, err := intAttr(item, attrCreatedAt)
	if err != nil {
		return nil, fail(attrCreatedAt, err)
	}
	env.CreatedAt = fromTicks(ticks)
	if n, ok, err := intAttr(item, attrBucketCount); err != nil {
		return nil, fail(attrBucketCount, err)
	} else if ok {
		env.BucketCount = int(n)
	}
	attempts, _, err := intAttr(item, attrAttempts)
	if err != nil {
		return nil, fail(attrAttempts, err)
	}
	env.Attempts = int(attempts)
	if n, ok, err := intAttr(item, attrNextAttemptAt); err != nil {
		return nil, fail(attrNextAttemptAt, err)
	} else if ok {
		env.NextAttemptAt = fromTicks(n)
	}
	env.LastError = stringAttr(item, attrLastError)
	return env, nil
}

func stringAttr(item map[string]types.AttributeValue, name string) string {
	if v, ok := item[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

// binaryAttr returns nil for an absent attribute and a non-nil slice for a present
// one, even an empty one: an empty key is a real key.
func binaryAttr(item map[string]types.AttributeValue, name string) []byte {
	v, ok := item[name].(*types.AttributeValueMemberB)
	if !ok {
		return nil
	}
	if v.Value == nil {
		return []byte{}
	}
	return v.Value
}

func intAttr(item map[string]types.AttributeValue, name string) (int64, bool, error) {
	v, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v.Value, 10, 64)
	return n, err == nil, err
}

func ticksOf(item map[string]types.AttributeValue, name string) (time.Time, error) {
	n, ok, err := intAttr(item, name)
	if err != nil || !ok {
		return time.Time{}, err
	}
	return fromTicks(n), nil
}

// truncateError keeps a failure text within maxLastError bytes and valid UTF-8, which
// a string attribute must be.
func truncateError(s string) string {
	if len(s) > maxLastError {
		s = s[:maxLastError]
	}
	return strings.ToValidUTF8(s, "")
}

// itemSize is DynamoDB's size of an item: attribute names plus values.
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return numberSize(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberNS:
		n := 0
		for _, s := range v.Value {
			n += numberSize(s)
		}
		return n
	case *types.AttributeValueMemberBS:
		n := 0
		for _, b := range v.Value {
			n += len(b)
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for name, e := range v.Value {
			n += 1 + len(name) + valueSize(e)
		}
		return n
	}
	return 0
}

// numberSize is an upper bound of a number's stored size: about one byte per two
// significant digits, plus one.
func numberSize(s string) int { return (len(s)+1)/2 + 1 }

// transactItemSize estimates what one transaction item adds to a request.
func transactItemSize(it types.TransactWriteItem) (size int, put bool) {
	switch {
	case it.Put != nil:
		return itemSize(it.Put.Item) + exprSize(it.Put.ConditionExpression, it.Put.ExpressionAttributeValues), true
	case it.Update != nil:
		return itemSize(it.Update.Key) + exprSize(it.Update.UpdateExpression, it.Update.ExpressionAttributeValues) +
			len(aws.ToString(it.Update.ConditionExpression)), false
	case it.Delete != nil:
		return itemSize(it.Delete.Key) + exprSize(it.Delete.ConditionExpression, it.Delete.ExpressionAttributeValues), false
	case it.ConditionCheck != nil:
		return itemSize(it.ConditionCheck.Key) + exprSize(it.ConditionCheck.ConditionExpression, it.ConditionCheck.ExpressionAttributeValues), false
	}
	return 0, false
}

func exprSize(expr *string, values map[string]types.AttributeValue) int {
	return len(aws.ToString(expr)) + itemSize(values)
}

// MessageKey reads the key of an item of the store's table, as a DynamoDB stream
// record carries it: it reports whether the partition and sort key values pk and sk
// name a pending message item of this store (not a parked message, a counter, a lease
// or a relay record, nor an item of another KeyPrefix or of the application), and if
// so its bucket and Seq. The bucket is not checked against the bucket count.
func (s driverStore) MessageKey(pk, sk string) (bucket int, seq int64, ok bool) {
	return s.messageKey(pk, sk)
}

func (s *Store) messageKey(pk, sk string) (bucket int, seq int64, ok bool) {
	digits, found := strings.CutPrefix(pk, s.keys.prefix+"#MESSAGES#")
	if !found || len(sk) != 19 {
		return 0, 0, false
	}
	b, err := strconv.Atoi(digits)
	if err != nil || b < 0 || strconv.Itoa(b) != digits {
		return 0, 0, false
	}
	n, err := strconv.ParseInt(sk, 10, 64)
	if err != nil || n < 0 || seqSortKey(n) != sk {
		return 0, 0, false
	}
	return b, n, true
}
