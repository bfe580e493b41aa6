package redistransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// Entry fields the transport writes. See the package documentation for when each is
// present.
const (
	// FieldMessageID carries the envelope's id on every entry.
	FieldMessageID = outbox.HeaderMessageID
	// FieldIdempotencyKey carries the idempotency key the transport stamps (the
	// message id) unless the application set one or Config.OmitIdempotencyKey is set.
	FieldIdempotencyKey = outbox.HeaderIdempotencyKey
	// FieldKey carries the key, byte for byte; absent for a nil key.
	FieldKey = "key"
	// FieldPayload carries the payload, byte for byte; absent for a tombstone.
	FieldPayload = "payload"
	// FieldHeaders carries the application's headers in the [driver.EncodeHeaders]
	// encoding; absent when there are none.
	FieldHeaders = "headers"
	// FieldTopic carries the topic when [Config.Stream] maps it to another stream.
	FieldTopic = "topic"
)

// DefaultMaxMessageSize is the default [Config.MaxMessageSize] (1 MiB).
const DefaultMaxMessageSize = 1 << 20

// maxBulk is Redis's default proto-max-bulk-len (512 MB), the largest field value.
const maxBulk = 512 << 20

// DefaultWaitTimeout is the default [Config.WaitTimeout].
const DefaultWaitTimeout = time.Second

// Config tunes a [Transport]. The zero value is ready to use.
type Config struct {
	// Stream maps a message's topic to the key of the stream it is appended to. It
	// must return a non-empty key; a topic it maps to "" fails permanently. When the
	// stream differs from the topic, each entry also carries the topic in the
	// [FieldTopic] field. Defaults to the topic itself.
	Stream func(topic string) string

	// MaxLen, when positive, trims each stream to about that many entries on every
	// append (XADD MAXLEN ~ n): Redis trims whole macro nodes, so a stream keeps at
	// least MaxLen entries and sometimes a few hundred more. Trimming deletes the
	// oldest entries whether or not every consumer group has read them. Defaults to 0:
	// no trimming.
	MaxLen int64

	// MaxMessageSize is the largest [outbox.Message.Size] the transport publishes;
	// [Transport.MaxMessageSize] reports it. A larger message fails permanently,
	// wrapping [outbox.ErrTooLarge], without being sent; capture refuses it at Send
	// when the transport is wired in through outbox.SenderConfig.Transport. Defaults
	// to 1 MiB; it may not exceed 512 MB (Redis's default proto-max-bulk-len).
	MaxMessageSize int

	// OmitIdempotencyKey stops the transport from adding the [FieldIdempotencyKey]
	// field (set to the message id) to entries whose message has no
	// [outbox.HeaderIdempotencyKey] header. Defaults to false.
	OmitIdempotencyKey bool

	// WaitReplicas, when positive, ends every batch with WAIT WaitReplicas
	// WaitTimeout in the same round trip, and reports the batch's entries failed
	// (transient) unless that many replicas acknowledged them: an entry the primary
	// acknowledged but no replica has is lost if the primary fails over. The entries
	// stay in the primary's streams, so the relay's retry appends them again (a
	// duplicate). WAIT makes loss on failover unlikely, not impossible (see the
	// package documentation). Defaults to 0: no WAIT; an acknowledged entry may be
	// lost on a restart or failover. Refused with a *redis.ClusterClient, where WAIT
	// reaches one node only.
	WaitReplicas int

	// WaitTimeout bounds the WAIT of [Config.WaitReplicas]. Keep it under the
	// client's ReadTimeout (3 s by default), which bounds the whole pipeline's
	// reply. Defaults to 1 s.
	WaitTimeout time.Duration
}

// Validate reports the first setting that cannot work, naming its field. Zero values
// are valid: they take their defaults.
func (c Config) Validate() error {
	// The first failed check, in field order.
	return cmp.Or(
		transportkit.Between("redistransport", "Config.MaxMessageSize", c.MaxMessageSize, 0, maxBulk, fmt.Sprintf("it must be between 1 and %d (or 0 for the default)", maxBulk)),
		transportkit.Positive("redistransport", "Config.MaxLen", c.MaxLen, "no trimming"),
		transportkit.Positive("redistransport", "Config.WaitReplicas", c.WaitReplicas, "no WAIT"),
		transportkit.Positive("redistransport", "Config.WaitTimeout", c.WaitTimeout, "the default"),
	)
}

// Transport appends outbox envelopes to Redis streams. It is safe for concurrent use.
type Transport struct {
	client redis.UniversalClient
	cfg    Config
}

// New returns a transport that appends through client (a *redis.Client, a failover
// client from redis.NewFailoverClient, or a *redis.ClusterClient). The client is the
// caller's: New never dials and the transport never closes it.
//
// New returns an error wrapping [outbox.ErrMisconfigured] when client is nil or cfg
// is invalid ([Config.Validate], and WaitReplicas with a cluster client).
func New(client redis.UniversalClient, cfg Config) (*Transport, error) {
	_, cluster := client.(*redis.ClusterClient)
	if err := transportkit.CheckArgs(client == nil, "redistransport: client is nil: pass a client from redis.NewClient", cfg); err != nil {
		return nil, err
	}
	if cluster && cfg.WaitReplicas > 0 {
		return nil, fmt.Errorf("%w: redistransport: Config.WaitReplicas needs a client of one primary (redis.NewClient or redis.NewFailoverClient): on a cluster client WAIT reaches a single node", outbox.ErrMisconfigured)
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = DefaultMaxMessageSize
	}
	if cfg.WaitTimeout == 0 {
		cfg.WaitTimeout = DefaultWaitTimeout
	}
	return &Transport{client: client, cfg: cfg}, nil
}

// KeepsKeyOrder implements [driver.KeyOrderKeeper]: a batch is one pipeline on one
// connection, which Redis executes in order, and after a key's first failure the
// transport reports the key's later entries failed too, so the relay sends a
// key's messages together.
func (t *Transport) KeepsKeyOrder() bool { return true }

// MaxMessageSize implements [driver.SizeLimiter]: [Config.MaxMessageSize], or, where
// that is 0, [DefaultMaxMessageSize].
func (t *Transport) MaxMessageSize() int { return t.cfg.MaxMessageSize }

// As reaches the underlying client: target must be a *redis.UniversalClient, or a
// **redis.Client or **redis.ClusterClient matching the client's type.
func (t *Transport) As(target any) bool {
	switch p := target.(type) {
	case *redis.UniversalClient:
		*p = t.client
		return true
	case **redis.Client:
		c, ok := t.client.(*redis.Client)
		if ok {
			*p = c
		}
		return ok
	case **redis.ClusterClient:
		c, ok := t.client.(*redis.ClusterClient)
		if ok {
			*p = c
		}
		return ok
	}
	return false
}

// Ping implements [driver.Pinger] with Redis's PING.
func (t *Transport) Ping(ctx context.Context) error {
	if err := t.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redistransport: ping: %w", err)
	}
	return nil
}

// Publish appends every envelope of the batch with one pipelined XADD each (and a
// WAIT, with [Config.WaitReplicas]), in one round trip. It returns nil when Redis
// acknowledged every entry, a [*driver.PublishError] naming the envelopes it did not
// (each cause marked [driver.Permanent] when retrying cannot help), or ctx's error
// when ctx ended first (then nothing may be assumed sent).
func (t *Transport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	return transportkit.Publish(ctx, batch, t.publish)
}

// publish sends batch for [transportkit.Publish], recording in errs why each envelope
// failed.
func (t *Transport) publish(ctx context.Context, batch []*driver.Envelope, errs []error) error {
	cmds := make([]*redis.StringCmd, len(batch))
	pipe := t.client.Pipeline()
	for i, env := range batch {
		args, err := t.encode(env)
		if err != nil {
			errs[i] = err
			continue
		}
		cmds[i] = pipe.XAdd(ctx, args)
	}
	var wait *redis.Cmd
	if t.cfg.WaitReplicas > 0 && pipe.Len() > 0 {
		wait = pipe.Do(ctx, "wait", t.cfg.WaitReplicas, t.cfg.WaitTimeout.Milliseconds())
	}
	if pipe.Len() > 0 {
		// Exec's error is the first command's; each command carries its own.
		_, _ = pipe.Exec(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	var replicated error
	if wait != nil {
		switch n, err := wait.Int64(); {
		case err != nil:
			replicated = fmt.Errorf("redistransport: WAIT %d: %w (the entries may be on the primary only; the retry may duplicate them)", t.cfg.WaitReplicas, err)
		case n < int64(t.cfg.WaitReplicas):
			replicated = fmt.Errorf("redistransport: only %d of %d replicas acknowledged within %s (Config.WaitReplicas); the entries are on the primary and the retry duplicates them", n, t.cfg.WaitReplicas, t.cfg.WaitTimeout)
		}
	}
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		switch err := cmd.Err(); {
		case err != nil:
			errs[i] = t.classify(batch[i], err)
		case replicated != nil:
			errs[i] = replicated
		}
	}
	transportkit.HoldBackTails(batch, errs, errHeldBack)
	return nil
}

// errHeldBack is reported for an entry of a key whose earlier entry in the batch
// failed.
var errHeldBack = errors.New("redistransport: reported failed: an earlier message of its key in the batch failed")

// streamOf maps a topic to its stream key.
func (t *Transport) streamOf(topic string) string {
	if t.cfg.Stream != nil {
		return t.cfg.Stream(topic)
	}
	return topic
}

// encode builds env's XADD, refusing what Redis must never be sent.
func (t *Transport) encode(env *driver.Envelope) (*redis.XAddArgs, error) {
	stream := t.streamOf(env.Topic)
	if stream == "" {
		return nil, driver.Permanent(fmt.Errorf("%w: redistransport: topic %q maps to an empty stream key (check Config.Stream)", outbox.ErrInvalidMessage, env.Topic))
	}
	if err := transportkit.CheckSize("redistransport", env, t.cfg.MaxMessageSize); err != nil {
		return nil, err
	}
	id := env.ID.String()
	values := make([]any, 0, 12)
	values = append(values, FieldMessageID, id)
	if env.Key != nil {
		values = append(values, FieldKey, env.Key)
	}
	if env.Payload != nil {
		values = append(values, FieldPayload, env.Payload)
	}
	if len(env.Headers) > 0 {
		values = append(values, FieldHeaders, driver.EncodeHeaders(env.Headers))
	}
	if !t.cfg.OmitIdempotencyKey {
		if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
			values = append(values, FieldIdempotencyKey, id)
		}
	}
	if stream != env.Topic {
		values = append(values, FieldTopic, env.Topic)
	}
	args := &redis.XAddArgs{Stream: stream, ID: "*", Values: values}
	if t.cfg.MaxLen > 0 {
		args.MaxLen, args.Approx = t.cfg.MaxLen, true
	}
	return args, nil
}

// classify turns one entry's failure into the error reported for it: the one place
// Redis and client errors are translated.
func (t *Transport) classify(env *driver.Envelope, err error) error {
	stream := t.streamOf(env.Topic)
	wrapped := fmt.Errorf("redistransport: XADD %q: %w", stream, err)
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return wrapped // the network, a timeout, a closed client: transient
	}
	msg := rerr.Error()
	switch {
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return driver.Permanent(fmt.Errorf("%w: redistransport: key %q holds another type than a stream: map the topic to another key with Config.Stream, or delete the key: %w", outbox.ErrMisconfigured, stream, err))
	case strings.HasPrefix(msg, "NOPERM"):
		return driver.Permanent(fmt.Errorf("%w: redistransport: the user may not XADD to %q: grant +xadd on the key (ACL SETUSER ... ~%s +xadd): %w", outbox.ErrMisconfigured, stream, stream, err))
	case strings.Contains(msg, "max-bulk-len") || strings.Contains(msg, "too big"):
		return driver.Permanent(fmt.Errorf("%w: %w", outbox.ErrTooLarge, wrapped))
	}
	// OOM, READONLY (a failover), LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, MASTERDOWN,
	// NOAUTH and every other answer: transient.
	return wrapped
}
