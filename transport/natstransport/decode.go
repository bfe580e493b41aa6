package natstransport

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
)

// Delivery is a message the outbox published, read back by a consumer.
type Delivery struct {
	// ID is the message id from the [outbox.HeaderMessageID] header. Consumers
	// deduplicate on it (or on the idempotency key).
	ID uuid.UUID
	// Message holds the topic, key (nil when the message had none), payload (nil for
	// a tombstone) and headers: the application's in capture order, then the
	// idempotency key the transport stamped (if any), then the message id.
	outbox.Message
	// Subject is the subject the message was published on.
	Subject string
	// Stream and Sequence locate the message in its stream, and Timestamp is when the
	// stream stored it; all zero for a message decoded with [DecodeMsg] that carries
	// no JetStream metadata.
	Stream    string
	Sequence  uint64
	Timestamp time.Time
}

// Decode turns a message consumed from a JetStream consumer back into what the outbox
// sent. The returned payload shares the message's memory. It fails, wrapping
// [outbox.ErrInvalidMessage], when the message carries no valid
// [outbox.HeaderMessageID] header (it did not come through the outbox) or a malformed
// header of the transport's.
func Decode(msg jetstream.Msg) (Delivery, error) {
	d, err := decode(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		return d, err
	}
	if meta, err := msg.Metadata(); err == nil {
		d.Stream, d.Sequence, d.Timestamp = meta.Stream, meta.Sequence.Stream, meta.Timestamp
	}
	return d, nil
}

// DecodeMsg is [Decode] for a message read with the core NATS API (a plain
// subscription on the subject, or a message fetched by the legacy JetStream API).
func DecodeMsg(msg *nats.Msg) (Delivery, error) {
	d, err := decode(msg.Subject, msg.Header, msg.Data)
	if err != nil {
		return d, err
	}
	if meta, err := msg.Metadata(); err == nil {
		d.Stream, d.Sequence, d.Timestamp = meta.Stream, meta.Sequence.Stream, meta.Timestamp
	}
	return d, nil
}

func parseID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.UUID{}, fmt.Errorf("not a UUID: %w", err)
	}
	return id, nil
}
