package sqstransport

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Message attributes the transport reserves. Application headers with these names are
// carried in the packed attribute instead, so they never clash.
const (
	// AttrMessageID carries the envelope ID (a String attribute) on every message. It
	// is also the value of the [outbox.HeaderMessageID] header.
	AttrMessageID = outbox.HeaderMessageID
	// AttrKey carries a non-empty key: a String attribute when the key is valid SQS
	// text, a Binary attribute otherwise.
	AttrKey = "x-outbox-key"
	// AttrLayout (a String attribute) is present only when a message needs it: it says
	// how the body is encoded, that the key is empty, and the order of the headers when
	// the default order would not restore it. See the package documentation.
	AttrLayout = "x-outbox-layout"
	// AttrHeaders (a Binary attribute) packs the headers that cannot travel as message
	// attributes of their own. See the package documentation for the codec.
	AttrHeaders = "x-outbox-headers"
)

const (
	// maxAttributes is SQS's limit of message attributes per message.
	maxAttributes = 10
	// maxGroupID is SQS's limit on MessageGroupId.
	maxGroupID = 128
	// maxAttributeName is SQS's limit on a message attribute's name.
	maxAttributeName = 256
	// placeholderBody is sent for nil and empty payloads: SQS refuses an empty body.
	placeholderBody = "-"

	dataTypeString = "String"
	dataTypeBinary = "Binary"

	layoutBodyBase64 = "body=base64"
	layoutBodyNil    = "body=nil"
	layoutBodyEmpty  = "body=empty"
	layoutKeyEmpty   = "key=empty"
	layoutHeaders    = "headers="
	// packedToken stands for "the next packed header" in the headers order.
	packedToken = "*"
)

// The transport's size accounting. SQS counts a message as its body plus every
// attribute's name, type and value; [outbox.Message.Size] counts topic, key, payload
// and header bytes. limitFor turns Config.QueueLimit into the largest Message.Size that
// always encodes within it; the constants below bound, from above, what SQS counts
// beyond the bytes Message.Size already holds.
const (
	// uuidText is the length of a message ID as sent.
	uuidText = 36
	// typeLen is the length of both data types the transport uses, "String" and
	// "Binary".
	typeLen = len(dataTypeString)
	// maxLenVarint bounds a uvarint in the packed headers: every length is under
	// 2 MiB (a message is at most MaxQueueLimit).
	maxLenVarint = 3

	// messageIDOverhead is the message ID attribute and its name in the layout's
	// header order.
	messageIDOverhead = len(AttrMessageID) + typeLen + uuidText + len(AttrMessageID) + 1
	// idempotencyOverhead is an added idempotency-key header: as an attribute with its
	// name in the header order (costlier than packed).
	idempotencyOverhead = len(outbox.HeaderIdempotencyKey) + typeLen + uuidText + len(outbox.HeaderIdempotencyKey) + 1
	// keyOverhead is the key attribute's name and type (the key itself is in Size).
	keyOverhead = len(AttrKey) + typeLen
	// packedOverhead is the packed attribute's name, type, version byte and count.
	packedOverhead = len(AttrHeaders) + typeLen + 1 + maxLenVarint
	// layoutOverhead is the layout attribute's name and type and its longest fields
	// but the header order's names.
	layoutOverhead = len(AttrLayout) + typeLen + len(layoutBodyBase64+";"+layoutKeyEmpty+";"+layoutHeaders)
	// headerOverhead bounds what one application header costs beyond its name and
	// value when packed: two length varints and its "*," in the header order.
	headerOverhead = 2*maxLenVarint + len(packedToken) + 1
	// nativeExtra is what a header sent as an attribute of its own may cost beyond
	// headerOverhead: its type, and its name (up to 256 bytes) again in the order.
	nativeExtra = typeLen + maxAttributeName + 1 - headerOverhead
	// maxNativeHeaders bounds the headers sent as attributes of their own: the
	// message ID and the layout attribute take two of the ten slots.
	maxNativeHeaders = maxAttributes - 2

	// coveredHeaders is how many application headers the largest
	// [Config.MaxMessageSize] always leaves room for: a message within it that has at
	// most this many headers fits [Config.QueueLimit], whatever its payload, key and
	// header bytes.
	coveredHeaders = 32

	// reserve is what SQS may count beyond a message's own bytes, for up to
	// coveredHeaders headers, before any idempotency key is added.
	reserve = messageIDOverhead + keyOverhead + packedOverhead + layoutOverhead +
		coveredHeaders*headerOverhead + maxNativeHeaders*nativeExtra
)

// limitFor is the largest [outbox.Message.Size] that always encodes within
// queueLimit when the message has at most coveredHeaders headers. The worst case is
// a binary payload: base64 sends 4 bytes for every 3. A message of size s (topic at
// least one byte, which SQS does not count) then takes at most (4s+4)/3 + the
// overheads.
func limitFor(queueLimit int, stampKey bool) int {
	return (3*(queueLimit-reserveFor(stampKey)) - 4) / 4
}

// queueLimitFor is the smallest queue limit for which limitFor reaches size.
func queueLimitFor(size int, stampKey bool) int {
	return reserveFor(stampKey) + (4*size+4+2)/3
}

func reserveFor(stampKey bool) int {
	if stampKey {
		return reserve + idempotencyOverhead
	}
	return reserve
}

func isReserved(name string) bool {
	switch name {
	case AttrMessageID, AttrKey, AttrLayout, AttrHeaders:
		return true
	}
	return false
}

// encoded is one envelope turned into a SendMessageBatch entry.
type encoded struct {
	body  string
	attrs map[string]types.MessageAttributeValue
	// size is the message size as SQS counts it: body plus every attribute's name,
	// type and value.
	size int
}

// encode turns env into a message body and attributes; stampKey adds an
// idempotency-key header equal to the message ID when env has none. It fails only for
// a message SQS can never take (too large): callers mark that permanent.
func encode(env *driver.Envelope, queueLimit int, stampKey bool) (encoded, error) {
	var (
		e      = encoded{attrs: make(map[string]types.MessageAttributeValue, 4)}
		layout []string
	)

	switch {
	case env.Payload == nil:
		e.body = placeholderBody
		layout = append(layout, layoutBodyNil)
	case len(env.Payload) == 0:
		e.body = placeholderBody
		layout = append(layout, layoutBodyEmpty)
	case validText(env.Payload):
		e.body = string(env.Payload)
	default:
		e.body = base64.StdEncoding.EncodeToString(env.Payload)
		layout = append(layout, layoutBodyBase64)
	}

	id := env.ID.String()
	e.attrs[AttrMessageID] = stringAttr(id)
	switch {
	case env.Key == nil:
	case len(env.Key) == 0:
		layout = append(layout, layoutKeyEmpty)
	default:
		e.attrs[AttrKey] = valueAttr(env.Key)
	}

	headers := effectiveHeaders(env.Headers, id, stampKey)
	appHeaders := len(headers) - 1

	// Slots left for application headers: 10 minus the ID, the key, and the layout
	// attribute (reserved whenever there are application headers: it usually carries
	// their order).
	slots := maxAttributes - len(e.attrs)
	if appHeaders > 0 || len(layout) > 0 {
		slots--
	}
	eligible := make([]bool, len(headers))
	seen := make(map[string]bool, len(headers))
	nEligible, nIneligible := 0, 0
	for i, h := range headers {
		if h.Key == AttrMessageID {
			continue
		}
		if nativeHeader(h) && !seen[h.Key] {
			eligible[i] = true
			nEligible++
		} else {
			nIneligible++
		}
		seen[h.Key] = true
	}
	if nIneligible > 0 || nEligible > slots {
		slots-- // one for the packed attribute
	}

	native := make([]bool, len(headers))
	var packed []outbox.Header
	for i, h := range headers {
		switch {
		case h.Key == AttrMessageID:
			native[i] = true
		case eligible[i] && slots > 0:
			native[i] = true
			slots--
			e.attrs[h.Key] = valueAttr(h.Value)
		default:
			packed = append(packed, h)
		}
	}
	if len(packed) > 0 {
		e.attrs[AttrHeaders] = types.MessageAttributeValue{DataType: aws.String(dataTypeBinary), BinaryValue: driver.EncodeHeaders(packed)}
	}
	if order := headerOrder(headers, native); order != "" {
		layout = append(layout, layoutHeaders+order)
	}
	if len(layout) > 0 {
		e.attrs[AttrLayout] = stringAttr(strings.Join(layout, ";"))
	}

	e.size = len(e.body)
	for name, v := range e.attrs {
		e.size += len(name) + len(*v.DataType) + len(v.BinaryValue)
		if v.StringValue != nil {
			e.size += len(*v.StringValue)
		}
	}
	if e.size > queueLimit {
		return encoded{}, fmt.Errorf("sqstransport: message is %d bytes as SQS counts it (body and attributes), over the %d-byte limit (Config.QueueLimit): %w", e.size, queueLimit, outbox.ErrTooLarge)
	}
	return e, nil
}

// effectiveHeaders returns the headers as published: the application's, with the
// message ID header set to id where the application put one, and, when stampKey is
// set and the application chose no idempotency key, an idempotency-key header equal
// to id. Added headers go at the end, the idempotency key before the message ID (the
// order a decoder assumes, so it costs no layout attribute).
func effectiveHeaders(hs []outbox.Header, id string, stampKey bool) []outbox.Header {
	out := make([]outbox.Header, 0, len(hs)+2)
	placed, hasKey := false, false
	for _, h := range hs {
		switch h.Key {
		case AttrMessageID:
			if !placed {
				out = append(out, outbox.Header{Key: AttrMessageID, Value: []byte(id)})
				placed = true
			}
			continue
		case outbox.HeaderIdempotencyKey:
			hasKey = true
		}
		out = append(out, h)
	}
	if stampKey && !hasKey {
		out = append(out, outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte(id)})
	}
	if !placed {
		out = append(out, outbox.Header{Key: AttrMessageID, Value: []byte(id)})
	}
	return out
}

// headerOrder returns the headers field of the layout attribute, or "" when the
// default order (see defaultOrder) already restores headers.
func headerOrder(headers []outbox.Header, native []bool) string {
	tokens := make([]string, len(headers))
	var names []string
	for i, h := range headers {
		if native[i] {
			tokens[i] = h.Key
			if h.Key != AttrMessageID {
				names = append(names, h.Key)
			}
		} else {
			tokens[i] = packedToken
		}
	}
	if slices.Equal(tokens, defaultOrder(names, len(headers)-1-len(names))) {
		return ""
	}
	return strings.Join(tokens, ",")
}

// defaultOrder is the header order a decoder assumes without a headers field: native
// attributes sorted by name, then the packed headers, then the message ID.
func defaultOrder(nativeNames []string, packed int) []string {
	out := slices.Clone(nativeNames)
	sort.Strings(out)
	for range packed {
		out = append(out, packedToken)
	}
	return append(out, AttrMessageID)
}

// nativeHeader reports whether h can travel as a message attribute of its own.
func nativeHeader(h outbox.Header) bool {
	return len(h.Value) > 0 && validAttributeName(h.Key) && !isReserved(h.Key)
}

// validAttributeName follows SQS's rules for message attribute names: up to 256
// characters of A-Z, a-z, 0-9, '-', '_' and '.'; no leading, trailing or doubled '.';
// no "AWS." or "Amazon." prefix in any case. Names used in the layout's header order
// must never contain ',', ';' or '='; these rules guarantee that.
func validAttributeName(name string) bool {
	if name == "" || len(name) > maxAttributeName {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	lower := strings.ToLower(name)
	return !strings.HasPrefix(lower, "aws.") && !strings.HasPrefix(lower, "amazon.") &&
		!strings.HasPrefix(name, ".") && !strings.HasSuffix(name, ".") && !strings.Contains(name, "..")
}

// validText reports whether b is text SQS accepts in a body or String attribute:
// UTF-8 made of #x9, #xA, #xD, #x20-#xD7FF, #xE000-#xFFFD and #x10000-#x10FFFF.
func validText(b []byte) bool {
	for len(b) > 0 {
		c := b[0]
		if c < utf8.RuneSelf {
			if c < 0x20 && c != '\t' && c != '\n' && c != '\r' {
				return false
			}
			b = b[1:]
			continue
		}
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n <= 1 {
			return false
		}
		if r == 0xFFFE || r == 0xFFFF {
			return false
		}
		b = b[n:]
	}
	return true
}

func stringAttr(s string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String(dataTypeString), StringValue: aws.String(s)}
}

// valueAttr carries non-empty bytes as a String attribute when they are valid text,
// else as a Binary one.
func valueAttr(b []byte) types.MessageAttributeValue {
	if validText(b) {
		return stringAttr(string(b))
	}
	return types.MessageAttributeValue{DataType: aws.String(dataTypeBinary), BinaryValue: b}
}

// GroupID returns the MessageGroupId the transport uses for env on a FIFO queue:
//
//   - a key that is already a valid group id (1 to 128 characters of printable ASCII,
//     '!' to '~') is used as it is;
//   - any other key (empty, binary, non-ASCII, or too long) becomes "b64:" followed by
//     its unpadded URL-safe base64 when that fits in 128 characters, else "sha256:"
//     followed by the hex SHA-256 of the key;
//   - a keyless message gets "bucket:" followed by its bucket number, so keyless
//     messages of one bucket keep the order the outbox relays them in.
//
// Two different keys may share a group only if one of them looks like another's
// encoding; that costs parallelism, never order.
func GroupID(env *driver.Envelope) string {
	switch {
	case env.Key == nil:
		return "bucket:" + strconv.Itoa(env.Bucket)
	case validGroupID(env.Key):
		return string(env.Key)
	}
	if enc := base64.RawURLEncoding.EncodedLen(len(env.Key)); enc+len("b64:") <= maxGroupID {
		return "b64:" + base64.RawURLEncoding.EncodeToString(env.Key)
	}
	sum := sha256.Sum256(env.Key)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func validGroupID(b []byte) bool {
	if len(b) == 0 || len(b) > maxGroupID {
		return false
	}
	for _, c := range b {
		if c < '!' || c > '~' {
			return false
		}
	}
	return true
}
