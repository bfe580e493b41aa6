package watermilltransport

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// Metadata entries the transport writes beside the message's own headers.
const (
	// MetadataHeaders lists the message's headers in order, as JSON: an entry
	// "name" means the value is the metadata entry of that name; an entry
	// ["name", "base64"] carries the value inline (a name that occurs more than once,
	// or a value that is not valid UTF-8).
	MetadataHeaders = "x-outbox-headers"
	// MetadataKey carries the message key when it is valid UTF-8 (absent for a
	// keyless message, present and empty for an empty key).
	MetadataKey = "x-outbox-key"
	// MetadataKeyBase64 carries, in standard base64, a key that is not valid UTF-8.
	MetadataKeyBase64 = "x-outbox-key-b64"
	// MetadataTombstone is "true" on a message whose payload is nil.
	MetadataTombstone = "x-outbox-tombstone"
	// MetadataTopic carries the outbox topic.
	MetadataTopic = "x-outbox-topic"
)

func reserved(name string) bool {
	switch name {
	case MetadataHeaders, MetadataKey, MetadataKeyBase64, MetadataTombstone, MetadataTopic:
		return true
	}
	return false
}

// Config tunes a [Transport]. The zero value is ready to use.
type Config struct {
	// Topic maps an envelope to the Watermill topic it is published on. Defaults to
	// the envelope's topic.
	Topic func(env *driver.Envelope) string

	// MaxMessageSize, when positive, is the largest [outbox.Message.Size] the
	// transport publishes; [Transport.MaxMessageSize] reports it, so capture refuses a
	// larger message at Send when the transport is wired in. A larger message fails
	// permanently, wrapping [outbox.ErrTooLarge], without being sent — on its own,
	// where the publisher would fail its whole call. Set it to what the broker behind
	// the publisher accepts, less room for the metadata. Defaults to 0: no limit.
	MaxMessageSize int

	// OmitIdempotencyKey stops the transport from adding an [outbox.HeaderIdempotencyKey]
	// header (set to the message id) to messages captured without one. Defaults to
	// false: every message carries it.
	OmitIdempotencyKey bool

	// Permanent reports whether an error the publisher returned is one retrying
	// cannot fix; every message of the failed call is then parked. Watermill has no
	// error classes of its own, so only the application, which knows its publisher,
	// can say. Defaults to nil: every publisher error is transient.
	Permanent func(err error) bool

	// PartialFailures declares that the publisher may write a later message of a
	// call to the broker after failing an earlier one (a batch producer that fails
	// messages one by one, say). The transport then does not claim
	// [driver.KeyOrderKeeper], and the relay puts at most one message of a key in
	// a call, so that a key's order survives such failures. Defaults to false: the
	// publisher, like Watermill's AMQP one, stops at the first failure of a call.
	PartialFailures bool

	// Ping, when set, is what [Transport.Ping] calls to learn, without publishing,
	// whether the publisher reaches its broker (for Watermill's AMQP publisher,
	// IsConnected). Defaults to nil: Ping reports nil, which makes the relay
	// behave as with a transport that cannot ping.
	Ping func(ctx context.Context) error
}

// Validate reports the first setting that cannot work, naming its field.
func (c Config) Validate() error {
	return transportkit.Positive("watermilltransport", "Config.MaxMessageSize", c.MaxMessageSize, "no limit")
}

// Transport publishes outbox envelopes through any Watermill [message.Publisher]. It
// is safe for concurrent use when the publisher is (Watermill's publishers are).
type Transport struct {
	pub message.Publisher
	cfg Config
}

// New returns a transport that publishes through pub. The publisher is the caller's:
// New never dials, and the transport never closes it. It returns an error wrapping
// [outbox.ErrMisconfigured] when pub is nil or cfg is invalid.
func New(pub message.Publisher, cfg Config) (*Transport, error) {
	if err := transportkit.CheckArgs(pub == nil, "watermilltransport: publisher is nil: pass the message.Publisher your Watermill adapter built", cfg); err != nil {
		return nil, err
	}
	if cfg.Topic == nil {
		cfg.Topic = func(env *driver.Envelope) string { return env.Topic }
	}
	return &Transport{pub: pub, cfg: cfg}, nil
}

// MaxMessageSize implements [driver.SizeLimiter]: [Config.MaxMessageSize], 0 for none.
func (t *Transport) MaxMessageSize() int { return t.cfg.MaxMessageSize }

// KeepsKeyOrder implements [driver.KeyOrderKeeper]: a failed publisher call fails all
// its messages, and the later messages of their keys in the batch are held back, so
// the transport never reports a key's message sent after failing an earlier one. It
// reports false with [Config.PartialFailures].
func (t *Transport) KeepsKeyOrder() bool { return !t.cfg.PartialFailures }

// Ping implements [driver.Pinger] with [Config.Ping]; without one it reports nil.
// Once ctx has ended it returns ctx's error, whatever Config.Ping would say.
func (t *Transport) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if t.cfg.Ping == nil {
		return nil
	}
	if err := t.cfg.Ping(ctx); err != nil {
		return fmt.Errorf("watermilltransport: ping: %w", err)
	}
	return nil
}

// As reaches the publisher: target must be a *message.Publisher.
func (t *Transport) As(target any) bool {
	if p, ok := target.(*message.Publisher); ok {
		*p = t.pub
		return true
	}
	return false
}

// group is one publisher call: messages of one topic, in batch order.
type group struct {
	topic   string
	indexes []int
	msgs    []*message.Message
}

var errHeldBack = errors.New("watermilltransport: not sent: an earlier message of its key in the batch failed")

// Publish sends the batch in as few publisher calls as order allows: one call per
// topic, unless a key moves between topics within the batch, which starts another
// call so that the key's messages still go out in order. Calls run one after the
// other. A failed call fails all its messages (the publisher reports a call, not a
// message), transient unless [Config.Permanent] says otherwise, and holds back the
// later messages of their keys. It returns nil when every call succeeded, a
// [*driver.PublishError] naming the failed messages, or ctx's error when ctx ended
// first (nothing may then be assumed sent).
func (t *Transport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	return transportkit.Publish(ctx, batch, t.publish)
}

// publish sends batch for [transportkit.Publish], recording in errs why each envelope
// failed.
func (t *Transport) publish(ctx context.Context, batch []*driver.Envelope, errs []error) error {
	var (
		groups     []*group
		topicGroup = map[string]int{} // topic -> index of its latest group
		keyGroup   = map[string]int{} // key -> index of the latest group holding it
		refused    = map[string]bool{}
	)
	for i, env := range batch {
		key, keyed := string(env.Key), env.Key != nil
		if keyed && refused[key] {
			errs[i] = errHeldBack
			continue
		}
		topic := t.cfg.Topic(env)
		msg, err := t.encode(ctx, env)
		if err != nil {
			errs[i] = err
			if keyed {
				refused[key] = true
			}
			continue
		}
		g, ok := topicGroup[topic]
		if !ok || (keyed && keyGroup[key] > g) {
			groups = append(groups, &group{topic: topic})
			g = len(groups) - 1
			topicGroup[topic] = g
		}
		if keyed {
			keyGroup[key] = g
		}
		groups[g].indexes = append(groups[g].indexes, i)
		groups[g].msgs = append(groups[g].msgs, msg)
	}
	failedKeys := map[string]bool{}
	for _, g := range groups {
		msgs, indexes := g.msgs[:0:0], g.indexes[:0:0]
		for j, i := range g.indexes {
			if env := batch[i]; env.Key != nil && failedKeys[string(env.Key)] {
				errs[i] = errHeldBack
				continue
			}
			msgs, indexes = append(msgs, g.msgs[j]), append(indexes, i)
		}
		if len(msgs) == 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		err := t.pub.Publish(g.topic, msgs...)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		cause := fmt.Errorf("watermilltransport: publish %d messages to %q (the call fails as a whole): %w", len(msgs), g.topic, err)
		if t.cfg.Permanent != nil && t.cfg.Permanent(err) {
			cause = driver.Permanent(cause)
		}
		for _, i := range indexes {
			errs[i] = cause
			if env := batch[i]; env.Key != nil {
				failedKeys[string(env.Key)] = true
			}
		}
	}
	return nil
}

// headerEntry is one element of MetadataHeaders.
type headerEntry struct {
	name     string
	inline   []byte // nil: the value is the metadata entry
	isInline bool
}

func (h headerEntry) MarshalJSON() ([]byte, error) {
	if !h.isInline {
		return json.Marshal(h.name)
	}
	return json.Marshal([2]string{h.name, base64.StdEncoding.EncodeToString(h.inline)})
}

// encode builds the Watermill message for env, or the permanent failure that keeps it
// from being sent.
func (t *Transport) encode(ctx context.Context, env *driver.Envelope) (*message.Message, error) {
	if err := transportkit.CheckSize("watermilltransport", env, t.cfg.MaxMessageSize); err != nil {
		return nil, err
	}
	id := env.ID.String()
	headers := make([]outbox.Header, 0, len(env.Headers)+2)
	count := make(map[string]int, len(env.Headers)+2)
	for _, h := range env.Headers {
		if reserved(h.Key) {
			return nil, driver.Permanent(fmt.Errorf("%w: watermilltransport: header %q is written by the transport: rename the application's header", outbox.ErrInvalidMessage, h.Key))
		}
		headers = append(headers, h)
		count[h.Key]++
	}
	if v, ok := env.Header(outbox.HeaderMessageID); !ok || string(v) != id {
		headers = append(headers, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(id)})
		count[outbox.HeaderMessageID]++
	}
	if !t.cfg.OmitIdempotencyKey {
		if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
			headers = append(headers, outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte(id)})
			count[outbox.HeaderIdempotencyKey]++
		}
	}
	md := make(message.Metadata, len(headers)+4)
	entries := make([]headerEntry, len(headers))
	for i, h := range headers {
		if count[h.Key] == 1 && utf8.Valid(h.Value) {
			md[h.Key] = string(h.Value)
			entries[i] = headerEntry{name: h.Key}
			continue
		}
		entries[i] = headerEntry{name: h.Key, inline: h.Value, isInline: true}
		if utf8.Valid(h.Value) {
			md[h.Key] = string(h.Value) // the last value, for consumers that read by name
		}
	}
	list, err := json.Marshal(entries)
	if err != nil {
		return nil, fmt.Errorf("watermilltransport: encode headers: %w", err)
	}
	md[MetadataHeaders] = string(list)
	md[MetadataTopic] = env.Topic
	switch {
	case env.Key == nil:
	case utf8.Valid(env.Key):
		md[MetadataKey] = string(env.Key)
	default:
		md[MetadataKeyBase64] = base64.StdEncoding.EncodeToString(env.Key)
	}
	payload := env.Payload
	if payload == nil {
		md[MetadataTombstone] = "true"
		payload = []byte{}
	}
	msg := message.NewMessage(id, payload)
	msg.Metadata = md
	msg.SetContext(ctx)
	return msg, nil
}
