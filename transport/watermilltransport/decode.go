package watermilltransport

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// Delivery is a message the outbox published, read back by a Watermill subscriber.
type Delivery struct {
	// ID is the message id from the [outbox.HeaderMessageID] header (also the
	// Watermill message UUID, where the adapter keeps it). Consumers deduplicate on it.
	ID uuid.UUID
	// Message holds the topic, key, payload (nil for a tombstone) and every header in
	// the order the outbox sent them, the stamped ones included. Partition is nil.
	outbox.Message
}

// Decode turns a received Watermill message back into what the outbox sent. The
// message's own metadata entries that did not come from the outbox (an adapter's,
// say) are left out. It fails, wrapping [outbox.ErrInvalidMessage], when the message
// carries no valid [outbox.HeaderMessageID] or its header list is damaged.
//
// A message from another publisher, without the header list, still decodes if it has
// the message id: its metadata become headers in name order.
func Decode(msg *message.Message) (Delivery, error) {
	var d Delivery
	md := msg.Metadata
	d.Topic = md.Get(MetadataTopic)
	if key, ok := md[MetadataKey]; ok {
		d.Key = []byte(key)
	} else if enc, ok := md[MetadataKeyBase64]; ok {
		key, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			return d, fmt.Errorf("%w: watermilltransport: message %s: %s: %w", outbox.ErrInvalidMessage, msg.UUID, MetadataKeyBase64, err)
		}
		d.Key = key
	}
	d.Payload = transportkit.Payload(msg.Payload, md.Get(MetadataTombstone) == "true")
	headers, err := decodeHeaders(md)
	if err != nil {
		return d, fmt.Errorf("%w: watermilltransport: message %s: %w", outbox.ErrInvalidMessage, msg.UUID, err)
	}
	d.Headers = headers
	id, err := transportkit.MessageID(&d.Message)
	if err != nil {
		return d, fmt.Errorf("%w: watermilltransport: message %s: %w", outbox.ErrInvalidMessage, msg.UUID, err)
	}
	d.ID = id
	return d, nil
}

func decodeHeaders(md message.Metadata) ([]outbox.Header, error) {
	list, ok := md[MetadataHeaders]
	if !ok {
		names := transportkit.OtherNames(md, reserved)
		headers := make([]outbox.Header, len(names))
		for i, name := range names {
			headers[i] = outbox.Header{Key: name, Value: []byte(md[name])}
		}
		return headers, nil
	}
	var entries []json.RawMessage
	if err := json.Unmarshal([]byte(list), &entries); err != nil {
		return nil, fmt.Errorf("%s: %w", MetadataHeaders, err)
	}
	if len(entries) == 0 {
		return nil, nil
	}
	headers := make([]outbox.Header, len(entries))
	for i, raw := range entries {
		var name string
		if err := json.Unmarshal(raw, &name); err == nil {
			value, ok := md[name]
			if !ok {
				return nil, fmt.Errorf("%s names %q, which the metadata lack", MetadataHeaders, name)
			}
			headers[i] = outbox.Header{Key: name, Value: []byte(value)}
			continue
		}
		var pair [2]string
		if err := json.Unmarshal(raw, &pair); err != nil {
			return nil, fmt.Errorf("%s entry %d: %w", MetadataHeaders, i, err)
		}
		value, err := base64.StdEncoding.DecodeString(pair[1])
		if err != nil {
			return nil, fmt.Errorf("%s entry %d (%q): %w", MetadataHeaders, i, pair[0], err)
		}
		headers[i] = outbox.Header{Key: pair[0], Value: value}
	}
	return headers, nil
}
