package natstransport

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// Headers the transport writes besides the application's. See the package
// documentation for when each is present.
const (
	// HeaderKey carries the message key when it is plain header text.
	HeaderKey = "x-outbox-key"
	// HeaderKeyBase64 carries any other key, base64 (standard, padded).
	HeaderKeyBase64 = "x-outbox-key-base64"
	// HeaderTombstone ("true") marks a nil payload, which NATS cannot tell from an
	// empty one.
	HeaderTombstone = "x-outbox-tombstone"
	// HeaderPacked carries every application header when they cannot travel as NATS
	// headers of their own in a way that restores them: the base64 (standard, padded)
	// of their [driver.EncodeHeaders] encoding.
	HeaderPacked = "x-outbox-headers"
	// HeaderTopic carries the topic when [Config.Subject] maps it to another subject.
	HeaderTopic = "x-outbox-topic"
)

// reserved are header names an application header may not take as a NATS header of
// its own (it is packed instead).
var reserved = map[string]bool{
	HeaderKey: true, HeaderKeyBase64: true, HeaderTombstone: true, HeaderPacked: true,
	HeaderTopic: true, outbox.HeaderMessageID: true,
}

// plainName reports whether an application header name can be a NATS header of its
// own: printable ASCII without ':', not reserved, not JetStream's (Nats-...).
func plainName(k string) bool {
	if k == "" || reserved[k] || len(k) >= 5 && strings.EqualFold(k[:5], "nats-") {
		return false
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}

// plainValue reports whether v survives NATS's header encoding unchanged: valid
// UTF-8 with no CR, LF or NUL, and no leading or trailing whitespace (the client
// trims it).
func plainValue(v []byte) bool {
	if !utf8.Valid(v) {
		return false
	}
	for _, c := range v {
		if c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	if len(v) > 0 {
		if first, last := v[0], v[len(v)-1]; first == ' ' || first == '\t' || last == ' ' || last == '\t' {
			return false
		}
	}
	return true
}

// plainHeaders reports whether the application's headers can travel as NATS headers
// of their own and be restored in order: every name and value plain, and the names
// in sorted order (the decoder restores plain headers sorted by name, stably; the
// order of one name's values is kept).
func plainHeaders(hs []outbox.Header) bool {
	for i, h := range hs {
		if !plainName(h.Key) || !plainValue(h.Value) {
			return false
		}
		if i > 0 && hs[i-1].Key > h.Key {
			return false
		}
	}
	return true
}

// encode builds the NATS message for env.
func (t *Transport) encode(env *driver.Envelope, subject string) (*nats.Msg, error) {
	id := env.ID.String()
	h := make(nats.Header, len(env.Headers)+4)
	h[jetstream.MsgIDHeader] = []string{id}
	h[outbox.HeaderMessageID] = []string{id}
	if plainHeaders(env.Headers) {
		for _, hd := range env.Headers {
			h[hd.Key] = append(h[hd.Key], string(hd.Value))
		}
	} else {
		h[HeaderPacked] = []string{base64.StdEncoding.EncodeToString(driver.EncodeHeaders(env.Headers))}
	}
	if !t.cfg.OmitIdempotencyKey {
		if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
			h[outbox.HeaderIdempotencyKey] = append(h[outbox.HeaderIdempotencyKey], id)
		}
	}
	switch {
	case env.Key == nil:
	case plainValue(env.Key):
		h[HeaderKey] = []string{string(env.Key)}
	default:
		h[HeaderKeyBase64] = []string{base64.StdEncoding.EncodeToString(env.Key)}
	}
	if env.Payload == nil {
		h[HeaderTombstone] = []string{"true"}
	}
	if subject != env.Topic {
		h[HeaderTopic] = []string{env.Topic}
	}
	if err := transportkit.CheckSize("natstransport", env, t.cfg.MaxMessageSize); err != nil {
		return nil, err
	}
	if size := wireSize(h, env.Payload); size > t.maxPayload {
		return nil, driver.Permanent(fmt.Errorf("%w: natstransport: message takes %d bytes once encoded (headers and payload), more than the server's max_payload of %d; binary keys and headers are sent base64", outbox.ErrTooLarge, size, t.maxPayload))
	}
	return &nats.Msg{Subject: subject, Header: h, Data: env.Payload}, nil
}

// wireSize is what NATS counts against max_payload: the header block and the data.
func wireSize(h nats.Header, data []byte) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n + len(data)
}

// unpackHeaders decodes a [HeaderPacked] value: base64, then [driver.DecodeHeaders].
func unpackHeaders(s string) ([]outbox.Header, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, err
	}
	return driver.DecodeHeaders(b)
}

// stamped are headers the transport writes that Decode does not return among the
// application's (the message id and idempotency key are returned after them).
var stamped = map[string]bool{
	jetstream.MsgIDHeader: true, HeaderKey: true, HeaderKeyBase64: true, HeaderTombstone: true,
	HeaderPacked: true, HeaderTopic: true, outbox.HeaderMessageID: true,
}

// decode restores the message from a NATS message's parts.
func decode(subject string, h nats.Header, data []byte) (Delivery, error) {
	d := Delivery{Subject: subject, Message: outbox.Message{Topic: subject, Payload: transportkit.Payload(data, h.Get(HeaderTombstone) == "true")}}
	if v := h.Get(HeaderTopic); v != "" {
		d.Topic = v
	}
	if vs, ok := h[HeaderKey]; ok && len(vs) > 0 {
		d.Key = []byte(vs[0])
	} else if vs, ok := h[HeaderKeyBase64]; ok && len(vs) > 0 {
		key, err := base64.StdEncoding.DecodeString(vs[0])
		if err != nil {
			return d, fmt.Errorf("%w: natstransport: message on %q: %s header: %w", outbox.ErrInvalidMessage, subject, HeaderKeyBase64, err)
		}
		d.Key = key
	}
	if vs, ok := h[HeaderPacked]; ok && len(vs) > 0 {
		hs, err := unpackHeaders(vs[0])
		if err != nil {
			return d, fmt.Errorf("%w: natstransport: message on %q: %s header: %w", outbox.ErrInvalidMessage, subject, HeaderPacked, err)
		}
		d.Headers = hs
		for _, v := range h[outbox.HeaderIdempotencyKey] {
			d.Headers = append(d.Headers, outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte(v)})
		}
	} else {
		for _, k := range transportkit.OtherNames(h, func(name string) bool { return stamped[name] }) {
			for _, v := range h[k] {
				d.Headers = append(d.Headers, outbox.Header{Key: k, Value: []byte(v)})
			}
		}
	}
	raw := h.Get(outbox.HeaderMessageID)
	if raw == "" {
		return d, fmt.Errorf("%w: natstransport: message on %q has no %s header: it did not come through the outbox", outbox.ErrInvalidMessage, subject, outbox.HeaderMessageID)
	}
	d.Headers = append(d.Headers, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(raw)})
	id, err := parseID(raw)
	if err != nil {
		return d, fmt.Errorf("%w: natstransport: message on %q: %s header %q: %w", outbox.ErrInvalidMessage, subject, outbox.HeaderMessageID, raw, err)
	}
	d.ID = id
	return d, nil
}
