package sqstransport

import (
	"encoding/base64"
	"fmt"
	"sort"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Delivery is a received SQS message decoded back into what the outbox published.
type Delivery struct {
	// ID is the envelope ID (the [AttrMessageID] attribute).
	ID uuid.UUID
	// Key is the message key: nil for a keyless message, empty for an empty key.
	Key []byte
	// Payload is the body, base64-decoded when the transport encoded it; nil for a
	// tombstone.
	Payload []byte
	// Headers are the headers in publish order: the application's, then those the
	// transport added (an [outbox.HeaderIdempotencyKey] unless the application set one
	// or [Config.OmitIdempotencyKey] is set, and [outbox.HeaderMessageID]).
	Headers []outbox.Header
}

// Header returns the value of the last header named key, and whether there was one:
// d.Header(outbox.HeaderIdempotencyKey) is the key to deduplicate on.
func (d *Delivery) Header(key string) ([]byte, bool) {
	for i := len(d.Headers) - 1; i >= 0; i-- {
		if d.Headers[i].Key == key {
			return d.Headers[i].Value, true
		}
	}
	return nil, false
}

// Decode turns a received message back into the message ID, key, headers and payload
// the transport published, reversing the attribute packing and base64. The message
// must have been received with its message attributes (MessageAttributeNames: "All");
// otherwise Decode reports the missing message ID attribute.
func Decode(m types.Message) (*Delivery, error) {
	idAttr, ok := m.MessageAttributes[AttrMessageID]
	if !ok || idAttr.StringValue == nil {
		return nil, fmt.Errorf("sqstransport: message has no %s attribute: receive with MessageAttributeNames [\"All\"], or it was not published by the outbox", AttrMessageID)
	}
	id, err := uuid.Parse(*idAttr.StringValue)
	if err != nil {
		return nil, fmt.Errorf("sqstransport: message ID attribute %q: %w", *idAttr.StringValue, err)
	}
	d := &Delivery{ID: id}

	var (
		bodyMode, order string
		emptyKey, sawID bool
	)
	if a, ok := m.MessageAttributes[AttrLayout]; ok && a.StringValue != nil {
		for _, field := range strings.Split(*a.StringValue, ";") {
			switch {
			case field == layoutBodyBase64 || field == layoutBodyNil || field == layoutBodyEmpty:
				bodyMode = field
			case field == layoutKeyEmpty:
				emptyKey = true
			case strings.HasPrefix(field, layoutHeaders):
				order = strings.TrimPrefix(field, layoutHeaders)
			case field == "":
			default:
				return nil, fmt.Errorf("sqstransport: unknown field %q in the %s attribute", field, AttrLayout)
			}
		}
	}

	body := ""
	if m.Body != nil {
		body = *m.Body
	}
	switch bodyMode {
	case layoutBodyNil:
	case layoutBodyEmpty:
		d.Payload = []byte{}
	case layoutBodyBase64:
		if d.Payload, err = base64.StdEncoding.DecodeString(body); err != nil {
			return nil, fmt.Errorf("sqstransport: base64 body: %w", err)
		}
	default:
		d.Payload = []byte(body)
	}

	if a, ok := m.MessageAttributes[AttrKey]; ok {
		d.Key = attrBytes(a)
	} else if emptyKey {
		d.Key = []byte{}
	}

	var packed []outbox.Header
	if a, ok := m.MessageAttributes[AttrHeaders]; ok {
		if packed, err = driver.DecodeHeaders(a.BinaryValue); err != nil {
			return nil, err
		}
	}
	native := make(map[string][]byte, len(m.MessageAttributes))
	var names []string
	for name, a := range m.MessageAttributes {
		if isReserved(name) {
			continue
		}
		native[name] = attrBytes(a)
		names = append(names, name)
	}

	var tokens []string
	if order != "" {
		tokens = strings.Split(order, ",")
	} else {
		sort.Strings(names)
		tokens = defaultOrder(names, len(packed))
	}
	d.Headers = make([]outbox.Header, 0, len(tokens))
	for _, tok := range tokens {
		switch tok {
		case packedToken:
			if len(packed) == 0 {
				return nil, fmt.Errorf("sqstransport: the %s attribute lists more packed headers than %s holds", AttrLayout, AttrHeaders)
			}
			d.Headers = append(d.Headers, packed[0])
			packed = packed[1:]
		case AttrMessageID:
			sawID = true
			d.Headers = append(d.Headers, outbox.Header{Key: AttrMessageID, Value: []byte(*idAttr.StringValue)})
		default:
			v, ok := native[tok]
			if !ok {
				return nil, fmt.Errorf("sqstransport: the %s attribute names header %q, which the message lacks", AttrLayout, tok)
			}
			d.Headers = append(d.Headers, outbox.Header{Key: tok, Value: v})
		}
	}
	if len(packed) > 0 || !sawID {
		return nil, fmt.Errorf("sqstransport: the %s attribute does not account for every header", AttrLayout)
	}
	return d, nil
}

// attrBytes returns an attribute's value as bytes, whatever its type.
func attrBytes(a types.MessageAttributeValue) []byte {
	if a.StringValue != nil {
		return []byte(*a.StringValue)
	}
	return append([]byte{}, a.BinaryValue...)
}
