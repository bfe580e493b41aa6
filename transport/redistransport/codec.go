package redistransport

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Delivery is a stream entry the outbox appended, read back by a consumer.
type Delivery struct {
	// ID is the message id from the [FieldMessageID] field. Consumers deduplicate on
	// it (or on the idempotency key).
	ID uuid.UUID
	// Message holds the topic, key (nil when the message had none), payload (nil for
	// a tombstone) and headers: the application's in capture order, then the
	// idempotency key the transport stamped (if any), then the message id.
	outbox.Message
	// Stream is the stream's key and EntryID the entry's id in it ("ms-seq").
	Stream  string
	EntryID string
	// Timestamp is when Redis appended the entry (the entry id's milliseconds): when
	// the relay published it, not when the application captured it.
	Timestamp time.Time
}

// Decode turns an entry read from stream (XRANGE, XREAD, XREADGROUP) back into what
// the outbox sent. It fails, wrapping [outbox.ErrInvalidMessage], when the entry has
// no valid [FieldMessageID] field (it did not come through the outbox) or a malformed
// field of the transport's.
func Decode(stream string, entry redis.XMessage) (Delivery, error) {
	d := Delivery{Stream: stream, EntryID: entry.ID, Message: outbox.Message{Topic: stream}}
	if ms, _, ok := strings.Cut(entry.ID, "-"); ok {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil {
			d.Timestamp = time.UnixMilli(n)
		}
	}
	field := func(name string) (string, bool, error) {
		v, ok := entry.Values[name]
		if !ok {
			return "", false, nil
		}
		s, ok := v.(string)
		if !ok {
			return "", true, fmt.Errorf("%w: redistransport: entry %s of %q: field %s is a %T, not a string", outbox.ErrInvalidMessage, entry.ID, stream, name, v)
		}
		return s, true, nil
	}
	if v, ok, err := field(FieldTopic); err != nil {
		return d, err
	} else if ok {
		d.Topic = v
	}
	if v, ok, err := field(FieldKey); err != nil {
		return d, err
	} else if ok {
		d.Key = []byte(v)
	}
	if v, ok, err := field(FieldPayload); err != nil {
		return d, err
	} else if ok {
		d.Payload = []byte(v)
	}
	if v, ok, err := field(FieldHeaders); err != nil {
		return d, err
	} else if ok {
		hs, err := driver.DecodeHeaders([]byte(v))
		if err != nil {
			return d, fmt.Errorf("%w: redistransport: entry %s of %q: field %s: %w", outbox.ErrInvalidMessage, entry.ID, stream, FieldHeaders, err)
		}
		d.Headers = hs
	}
	if v, ok, err := field(FieldIdempotencyKey); err != nil {
		return d, err
	} else if ok {
		d.Headers = append(d.Headers, outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte(v)})
	}
	raw, ok, err := field(FieldMessageID)
	if err != nil {
		return d, err
	}
	if !ok {
		return d, fmt.Errorf("%w: redistransport: entry %s of %q has no %s field: it did not come through the outbox", outbox.ErrInvalidMessage, entry.ID, stream, FieldMessageID)
	}
	d.Headers = append(d.Headers, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(raw)})
	id, err := uuid.Parse(raw)
	if err != nil {
		return d, fmt.Errorf("%w: redistransport: entry %s of %q: %s field %q: %w", outbox.ErrInvalidMessage, entry.ID, stream, FieldMessageID, raw, err)
	}
	d.ID = id
	return d, nil
}
