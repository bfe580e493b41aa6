package rabbitmqtransport

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// Delivery is a message the outbox published, read back by a consumer.
type Delivery struct {
	// ID is the message id: the last [outbox.HeaderMessageID] header, which is also
	// the AMQP message-id property. Consumers deduplicate on it (or on the
	// idempotency key).
	ID uuid.UUID
	// Message holds the topic, key, payload (nil for a tombstone) and every header in
	// the order the outbox sent them, the stamped ones included. Partition is nil.
	outbox.Message
	// Exchange and RoutingKey are where the message was published.
	Exchange, RoutingKey string
	// Redelivered reports that the broker delivered the message before without an
	// acknowledgement from the consumer.
	Redelivered bool
	// Timestamp is when the relay published the message (second precision, as AMQP
	// keeps it), not when the application captured it.
	Timestamp time.Time
}

// Decode turns a consumed AMQP delivery back into what the outbox sent. It fails,
// wrapping [outbox.ErrInvalidMessage], when the delivery carries no valid
// [outbox.HeaderMessageID] header (it did not come through the outbox).
//
// A message from another publisher, without the transport's header order list, still
// decodes: its headers come in name order, its key is nil and its topic is the
// exchange.
func Decode(d amqp.Delivery) (Delivery, error) {
	out := Delivery{
		Exchange:    d.Exchange,
		RoutingKey:  d.RoutingKey,
		Redelivered: d.Redelivered,
		Timestamp:   d.Timestamp,
	}
	out.Topic = d.Exchange
	if topic, ok := d.Headers[HeaderTopic].(string); ok {
		out.Topic = topic
	}
	if key, ok := d.Headers[HeaderKey].(string); ok {
		out.Key = []byte(key)
	}
	tomb, _ := d.Headers[HeaderTombstone].(bool)
	out.Payload = transportkit.Payload(d.Body, tomb)
	headers, err := decodeHeaders(d.Headers)
	if err != nil {
		return out, fmt.Errorf("%w: rabbitmqtransport: delivery %q from exchange %q: %w", outbox.ErrInvalidMessage, d.MessageId, d.Exchange, err)
	}
	out.Headers = headers
	id, err := transportkit.MessageID(&out.Message)
	if err != nil {
		return out, fmt.Errorf("%w: rabbitmqtransport: delivery %q from exchange %q: %w", outbox.ErrInvalidMessage, d.MessageId, d.Exchange, err)
	}
	out.ID = id
	return out, nil
}

// decodeHeaders rebuilds the ordered header list from the table.
func decodeHeaders(table amqp.Table) ([]outbox.Header, error) {
	order, ok := table[HeaderOrder].([]any)
	if !ok {
		names := transportkit.OtherNames(table, reserved)
		order = make([]any, 0, len(names))
		for _, name := range names {
			if values, ok := table[name].([]any); ok {
				for range values {
					order = append(order, name)
				}
			} else {
				order = append(order, name)
			}
		}
	}
	if len(order) == 0 {
		return nil, nil
	}
	headers := make([]outbox.Header, 0, len(order))
	seen := map[string]int{}
	for _, entry := range order {
		name, ok := entry.(string)
		if !ok {
			return nil, fmt.Errorf("%s holds a %T, not a header name", HeaderOrder, entry)
		}
		var value any
		switch v := table[name].(type) {
		case nil:
			return nil, fmt.Errorf("%s names header %q, which the table lacks", HeaderOrder, name)
		case []any:
			n := seen[name]
			if n >= len(v) {
				return nil, fmt.Errorf("%s names header %q more often than it has values", HeaderOrder, name)
			}
			value = v[n]
		default:
			value = v
		}
		seen[name]++
		headers = append(headers, outbox.Header{Key: name, Value: valueBytes(value)})
	}
	return headers, nil
}

// valueBytes renders a header value as bytes: strings and byte arrays as they are,
// anything another publisher put there as text.
func valueBytes(v any) []byte {
	switch v := v.(type) {
	case string:
		return []byte(v)
	case []byte:
		return v
	default:
		return fmt.Append(nil, v)
	}
}
