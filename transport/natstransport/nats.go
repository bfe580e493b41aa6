package natstransport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// DefaultMaxPayload is NATS's default max_payload (1 MiB), assumed when the
// connection has not learnt the server's.
const DefaultMaxPayload = 1 << 20

// framingAllowance is the room the default [Config.MaxMessageSize] leaves under the
// server's max_payload for the headers the transport adds: the header block's
// framing, Nats-Msg-Id, the message id, the idempotency key, the key's own header and
// the framing of a few application headers.
const framingAllowance = 512

// DefaultAckTimeout is the default [Config.AckTimeout].
const DefaultAckTimeout = 10 * time.Second

// Config tunes a [Transport]. The zero value is ready to use.
type Config struct {
	// Subject maps a message's topic to the subject it is published on. It must
	// return a valid subject for publishing (dot-separated tokens, no wildcards, no
	// whitespace); a topic it maps to an invalid one fails permanently. When the
	// subject differs from the topic, each message also carries the topic in the
	// [HeaderTopic] header, so [Decode] returns the topic. Defaults to the topic
	// itself.
	Subject func(topic string) string

	// MaxMessageSize is the largest [outbox.Message.Size] (of the message as
	// captured) the transport publishes; [Transport.MaxMessageSize] reports it. A
	// larger message fails permanently, wrapping [outbox.ErrTooLarge], without being
	// sent; capture refuses it at Send when the transport is wired in through
	// outbox.SenderConfig.Transport. Defaults to the server's max_payload as the
	// connection learnt it (1 MiB when it has not) less 512 bytes for the headers the
	// transport adds. It may not exceed max_payload less those 512 bytes.
	MaxMessageSize int

	// OmitIdempotencyKey stops the transport from adding an
	// [outbox.HeaderIdempotencyKey] header (set to the message id) to messages
	// captured without one. Defaults to false: every message carries the header.
	OmitIdempotencyKey bool

	// AckTimeout bounds how long Publish waits for the stream's acknowledgements
	// after the batch was handed to the connection. Messages not acknowledged by then
	// are reported failed, transient; the connection may still deliver them, and the
	// stream's duplicate window drops the relay's retry if it does. Keep it well
	// under the relay's LeaseDuration. Defaults to 10 s; a negative value waits
	// until ctx ends.
	AckTimeout time.Duration

	// PipelineKeys lets the relay put several messages of one key in one
	// Publish call ([driver.KeyOrderKeeper]). They are published back to back and
	// acknowledged together, which is faster for workloads where a few keys carry
	// most messages, but a key's order then holds only while nothing fails: if the
	// connection drops mid-batch, or the stream refuses one message (a limit, a full
	// stream) and accepts a later one, the later message can be stored before the
	// retry of the earlier one. The transport then reports the key's later messages
	// failed too, so they are retried (the duplicate window drops the copies the
	// stream already has) — but the stream keeps them where they landed. Defaults to
	// false: the relay sends at most one message per key per call, and a key's
	// order always holds.
	PipelineKeys bool
}

// Validate reports the first setting that cannot work, naming its field. Zero values
// are valid: they take their defaults. [New] also checks MaxMessageSize against the
// connection's max_payload.
func (c Config) Validate() error {
	return transportkit.Positive("natstransport", "Config.MaxMessageSize", c.MaxMessageSize, "the default")
}

// Transport publishes outbox envelopes to NATS JetStream streams. It is safe for
// concurrent use.
type Transport struct {
	js  jetstream.JetStream
	cfg Config
	// maxPayload is the server's max_payload, as known when New ran.
	maxPayload int
}

// New returns a transport that publishes through js, a JetStream context the caller
// built on its own connection (jetstream.New(nc)). New never dials and the
// transport never closes the connection. Streams are the deployment's: the
// transport creates none, and a message whose subject no stream captures fails
// permanently.
//
// New returns an error wrapping [outbox.ErrMisconfigured] when js is nil or cfg is
// invalid ([Config.Validate], and a MaxMessageSize over the connection's
// max_payload less 512 bytes).
func New(js jetstream.JetStream, cfg Config) (*Transport, error) {
	if err := transportkit.CheckArgs(js == nil || js.Conn() == nil, "natstransport: JetStream context is nil: pass jetstream.New(nc) on a connection from nats.Connect", cfg); err != nil {
		return nil, err
	}
	maxPayload := int(js.Conn().MaxPayload())
	if maxPayload <= 0 {
		maxPayload = DefaultMaxPayload
	}
	capacity := maxPayload - framingAllowance
	switch {
	case cfg.MaxMessageSize == 0:
		cfg.MaxMessageSize = capacity
	case cfg.MaxMessageSize > capacity:
		return nil, fmt.Errorf("%w: natstransport: Config.MaxMessageSize %d exceeds the server's max_payload (%d) less %d bytes for headers: raise max_payload on the server to at least %d, or lower the setting", outbox.ErrMisconfigured, cfg.MaxMessageSize, maxPayload, framingAllowance, cfg.MaxMessageSize+framingAllowance)
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	return &Transport{js: js, cfg: cfg, maxPayload: maxPayload}, nil
}

// KeepsKeyOrder implements [driver.KeyOrderKeeper]: it reports [Config.PipelineKeys].
func (t *Transport) KeepsKeyOrder() bool { return t.cfg.PipelineKeys }

// MaxMessageSize implements [driver.SizeLimiter]: [Config.MaxMessageSize], or, where
// that is 0, the connection's max_payload less the room the headers need.
func (t *Transport) MaxMessageSize() int { return t.cfg.MaxMessageSize }

// As reaches the underlying clients: target must be a **nats.Conn or a
// *jetstream.JetStream.
func (t *Transport) As(target any) bool {
	switch p := target.(type) {
	case **nats.Conn:
		*p = t.js.Conn()
		return true
	case *jetstream.JetStream:
		*p = t.js
		return true
	}
	return false
}

// Ping implements [driver.Pinger]: it asks JetStream for the account's information,
// which publishes nothing. It fails when the connection is down or JetStream does not
// answer (wrapping [outbox.ErrMisconfigured] when JetStream is not enabled).
func (t *Transport) Ping(ctx context.Context) error {
	if nc := t.js.Conn(); !nc.IsConnected() {
		return fmt.Errorf("natstransport: ping: connection is %s", nc.Status())
	}
	if _, err := t.js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return fmt.Errorf("%w: natstransport: ping: %w: enable JetStream on the server (-js) and for the account", outbox.ErrMisconfigured, err)
		}
		return fmt.Errorf("natstransport: ping: %w", err)
	}
	return nil
}

// Publish hands every envelope of the batch to the connection as an asynchronous
// JetStream publish and waits once for the stream's acknowledgements. It returns nil
// when every message was acknowledged (a duplicate the stream dropped counts as
// acknowledged: the stream has it), a [*driver.PublishError] naming the envelopes
// that were not (each cause marked [driver.Permanent] when retrying cannot help), or
// ctx's error when ctx ended first (then nothing may be assumed sent).
func (t *Transport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	return transportkit.Publish(ctx, batch, t.publish)
}

// publish sends batch for [transportkit.Publish], recording in errs why each envelope
// failed.
func (t *Transport) publish(ctx context.Context, batch []*driver.Envelope, errs []error) error {
	var (
		futures = make([]jetstream.PubAckFuture, len(batch))
		// subjects caches each topic's subject and whether a stream captures it.
		subjects = map[string]*subjectInfo{}
	)
	for i, env := range batch {
		si := subjects[env.Topic]
		if si == nil {
			si = t.subjectOf(env.Topic)
			subjects[env.Topic] = si
		}
		if si.err != nil {
			errs[i] = si.err
			continue
		}
		msg, err := t.encode(env, si.subject)
		if err == nil {
			futures[i], err = t.js.PublishMsgAsync(msg)
		}
		if err != nil {
			errs[i] = t.classify(ctx, env, si, err)
		}
	}

	var timeout <-chan time.Time
	if t.cfg.AckTimeout > 0 {
		timer := time.NewTimer(t.cfg.AckTimeout)
		defer timer.Stop()
		timeout = timer.C
	}
	timedOut := false
	for i, f := range futures {
		if f == nil {
			continue
		}
		var err error
		if timedOut {
			err = resolved(f)
		} else {
			select {
			case <-f.Ok():
			case err = <-f.Err():
			case <-ctx.Done():
				return ctx.Err()
			case <-timeout:
				timedOut = true
				err = resolved(f)
			}
		}
		if err != nil {
			errs[i] = t.classify(ctx, batch[i], subjects[batch[i].Topic], err)
		}
	}
	if t.cfg.PipelineKeys {
		transportkit.HoldBackTails(batch, errs, errHeldBack)
	}
	return nil
}

// resolved returns f's outcome if it has one, without waiting, and errNoAck if not.
func resolved(f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	default:
		return errNoAck
	}
}

var (
	// errNoAck reports messages the stream did not acknowledge within AckTimeout.
	errNoAck = errors.New("natstransport: no acknowledgement within Config.AckTimeout; the stream may still store the message (its duplicate window drops the retry)")
	// errHeldBack is reported for a message of a key whose earlier message in the
	// same batch failed.
	errHeldBack = errors.New("natstransport: reported failed: an earlier message of its key in the batch failed (with Config.PipelineKeys)")
)

// subjectInfo is what Publish learns about one topic in one call.
type subjectInfo struct {
	subject string
	err     error // the topic maps to an invalid subject
	// checked and noStream cache the stream lookup made after a publish found no
	// stream answering.
	checked  bool
	noStream error
}

func (t *Transport) subjectOf(topic string) *subjectInfo {
	subject := topic
	if t.cfg.Subject != nil {
		subject = t.cfg.Subject(topic)
	}
	if err := validSubject(subject); err != nil {
		return &subjectInfo{subject: subject, err: driver.Permanent(fmt.Errorf("%w: natstransport: topic %q: %w", outbox.ErrInvalidMessage, topic, err))}
	}
	return &subjectInfo{subject: subject}
}

// validSubject reports whether s can be published to: dot-separated non-empty
// tokens, no wildcards, no whitespace or control characters.
func validSubject(s string) error {
	if s == "" {
		return errors.New("subject is empty (check Config.Subject)")
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return fmt.Errorf("subject %q has an empty token (leading, trailing or doubled dot)", s)
		}
		if tok == "*" || tok == ">" {
			return fmt.Errorf("subject %q holds a wildcard; publish to a concrete subject", s)
		}
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("subject %q holds whitespace or a control character", s)
		}
	}
	return nil
}

// permanentCodes are JetStream API errors retrying the same message cannot change.
var permanentCodes = map[jetstream.ErrorCode]bool{
	jetstream.JSErrCodeBadRequest:                    true,
	jetstream.JSErrCodeJetStreamNotEnabledForAccount: true,
	jetstream.JSErrCodeJetStreamNotEnabled:           true,
}

// classify turns one message's failure into the error reported for it: the one
// place client and server errors are translated.
func (t *Transport) classify(ctx context.Context, env *driver.Envelope, si *subjectInfo, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, errNoAck):
		return err
	case errors.Is(err, nats.ErrMaxPayload):
		return driver.Permanent(fmt.Errorf("%w: natstransport: message to %q exceeds the server's max_payload (%d bytes) once encoded: %w", outbox.ErrTooLarge, si.subject, t.maxPayload, err))
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return driver.Permanent(fmt.Errorf("%w: natstransport: the stream for %q refuses the message: %w; raise the stream's max_msg_size or lower Config.MaxMessageSize", outbox.ErrTooLarge, si.subject, err))
	case errors.As(err, &apiErr) && permanentCodes[apiErr.ErrorCode]:
		return driver.Permanent(fmt.Errorf("natstransport: publish to %q: %w", si.subject, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		// Nothing answered on the subject: either no stream captures it (permanent)
		// or its stream did not answer in time (a leader election, a restart).
		if noStream := t.lookupStream(ctx, si); noStream != nil {
			return noStream
		}
		return fmt.Errorf("natstransport: publish to %q: %w (a stream captures the subject but did not answer)", si.subject, err)
	case errors.Is(err, nats.ErrBadSubject), errors.Is(err, nats.ErrBadHeaderMsg):
		return driver.Permanent(fmt.Errorf("%w: natstransport: publish to %q: %w", outbox.ErrInvalidMessage, si.subject, err))
	}
	return fmt.Errorf("natstransport: publish to %q: %w", si.subject, err)
}

// lookupStream asks, once per subject per call, whether any stream captures the
// subject, and returns a permanent error if none does.
func (t *Transport) lookupStream(ctx context.Context, si *subjectInfo) error {
	if si.checked {
		return si.noStream
	}
	si.checked = true
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := t.js.StreamNameBySubject(lctx, si.subject); errors.Is(err, jetstream.ErrStreamNotFound) {
		si.noStream = driver.Permanent(fmt.Errorf("%w: natstransport: no stream captures subject %q: add it to a stream's subjects (or map the topic elsewhere with Config.Subject): %w", outbox.ErrMisconfigured, si.subject, err))
	}
	return si.noStream
}
