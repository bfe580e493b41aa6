package kafkatransport

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// Delivery is a record the outbox published, read back by a consumer.
type Delivery struct {
	// ID is the message id from the last [outbox.HeaderMessageID] header. Consumers
	// deduplicate on it (or on the idempotency key).
	ID uuid.UUID
	// Message holds the topic, key, payload (nil for a tombstone) and every header in
	// wire order, the stamped ones included. Partition points at the record's
	// partition.
	outbox.Message
	// Offset is the record's offset in its partition.
	Offset int64
	// Timestamp is the record's timestamp: when the relay produced it, not when the
	// application captured it.
	Timestamp time.Time
}

// Decode turns a consumed record back into what the outbox sent. The returned slices
// share the record's memory. It fails, wrapping [outbox.ErrInvalidMessage], when the
// record carries no valid [outbox.HeaderMessageID] header (it did not come through
// the outbox).
func Decode(rec *kgo.Record) (Delivery, error) {
	d := Delivery{
		Message: outbox.Message{
			Topic:     rec.Topic,
			Key:       rec.Key,
			Payload:   rec.Value,
			Partition: &rec.Partition,
		},
		Offset:    rec.Offset,
		Timestamp: rec.Timestamp,
	}
	if len(rec.Headers) > 0 {
		d.Headers = make([]outbox.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			d.Headers[i] = outbox.Header{Key: h.Key, Value: h.Value}
		}
	}
	id, err := transportkit.MessageID(&d.Message)
	if err != nil {
		return d, fmt.Errorf("%w: kafkatransport: record %s/%d@%d: %w", outbox.ErrInvalidMessage, rec.Topic, rec.Partition, rec.Offset, err)
	}
	d.ID = id
	return d, nil
}
