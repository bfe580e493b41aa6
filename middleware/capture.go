package middleware

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
)

// Config configures an [Outbox].
type Config struct {
	// Mode is how captured sends reach the store. Routes may override it
	// ([WithMode]). Defaults to [outbox.Immediate].
	Mode outbox.WriteMode
	// DisableIdempotencyKey stops capture from stamping the [outbox.HeaderIdempotencyKey]
	// header. Defaults to false: a message without the header gets one equal to its
	// message id, so consumers can deduplicate redeliveries with no extra work.
	DisableIdempotencyKey bool
	// MaxMessageSize is the largest [outbox.Message.Size], headers stamped at capture
	// included, that capture accepts. If the store implements [outbox.SizeLimiter],
	// the smaller of the two limits applies. Defaults to 0: only the store's limit, if
	// any.
	MaxMessageSize int
}

// validate checks c and names the offending field.
func (c Config) validate() error {
	switch c.Mode {
	case outbox.Immediate, outbox.Transactional:
	default:
		return fmt.Errorf("%w: middleware.Config.Mode %v is not outbox.Immediate or outbox.Transactional", outbox.ErrMisconfigured, c.Mode)
	}
	if c.MaxMessageSize < 0 {
		return fmt.Errorf("%w: middleware.Config.MaxMessageSize %d is negative; use 0 for no limit of its own", outbox.ErrMisconfigured, c.MaxMessageSize)
	}
	return nil
}

// Outbox captures sends into a store. Build one per store with [NewOutbox] and add
// [Outbox.UseOutbox] to the routes whose sends must be durable. It is safe for
// concurrent use.
type Outbox struct {
	store   outbox.Store
	cfg     Config
	buckets int
	limit   int // 0: none
}

// NewOutbox returns the capture for store. It does not take ownership of store.
func NewOutbox(store outbox.Store, cfg Config) (*Outbox, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: middleware.NewOutbox: store is nil", outbox.ErrMisconfigured)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	buckets := store.BucketCount()
	if buckets < 1 {
		return nil, fmt.Errorf("%w: middleware.NewOutbox: store reports %d buckets", outbox.ErrMisconfigured, buckets)
	}
	limit := cfg.MaxMessageSize
	if sl, ok := store.(outbox.SizeLimiter); ok {
		if n := sl.MaxMessageSize(); n > 0 && (limit == 0 || n < limit) {
			limit = n
		}
	}
	return &Outbox{store: store, cfg: cfg, buckets: buckets, limit: limit}, nil
}

// MaxMessageSize is the limit capture enforces, 0 for none.
func (o *Outbox) MaxMessageSize() int { return o.limit }

// Mode is the outbox-wide write mode.
func (o *Outbox) Mode() outbox.WriteMode { return o.cfg.Mode }

// Option changes one route's capture.
type Option func(*captureSettings)

type captureSettings struct {
	mode outbox.WriteMode
}

// WithMode overrides the outbox's write mode on one route. An invalid mode makes
// UseOutbox panic at registration.
func WithMode(mode outbox.WriteMode) Option {
	return func(s *captureSettings) { s.mode = mode }
}

// UseOutbox returns the capture middleware. It never calls the next Sender: the send
// ends at capture, and a dispatcher publishes the envelope later.
func (o *Outbox) UseOutbox(opts ...Option) Middleware {
	s := captureSettings{mode: o.cfg.Mode}
	for _, opt := range opts {
		opt(&s)
	}
	if s.mode != outbox.Immediate && s.mode != outbox.Transactional {
		panic(fmt.Sprintf("middleware: UseOutbox: WithMode(%v) is not outbox.Immediate or outbox.Transactional", s.mode))
	}
	c := capture{o: o, mode: s.mode}
	return func(Sender) Sender { return c }
}

// Send captures msg with the outbox-wide mode, for callers that need no router.
func (o *Outbox) Send(ctx context.Context, msg outbox.Message) error {
	return o.capture(ctx, msg, o.cfg.Mode)
}

type capture struct {
	o    *Outbox
	mode outbox.WriteMode
}

func (c capture) Send(ctx context.Context, msg outbox.Message) error {
	return c.o.capture(ctx, msg, c.mode)
}

func (o *Outbox) capture(ctx context.Context, msg outbox.Message, mode outbox.WriteMode) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var scope *outbox.Scope
	if mode == outbox.Transactional {
		if scope = outbox.ScopeFrom(ctx); scope == nil {
			return fmt.Errorf("middleware: topic %q: %w", msg.Topic, outbox.ErrNoScope)
		}
	}
	env, err := outbox.NewEnvelope(msg, o.buckets)
	if err != nil {
		return err
	}
	if !o.cfg.DisableIdempotencyKey {
		if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
			env.Headers = withHeader(env.Headers, outbox.HeaderIdempotencyKey, idempotencyKey(env))
		}
	}
	if o.limit > 0 {
		if n := env.Size(); n > o.limit {
			return fmt.Errorf("%w: message for topic %q is %d bytes, over the limit of %d; nothing was written", outbox.ErrTooLarge, msg.Topic, n, o.limit)
		}
	}
	if mode == outbox.Transactional {
		return scope.Stage(env)
	}
	if err := o.store.Enqueue(ctx, env); err != nil {
		if isContextErr(err) {
			return err
		}
		return fmt.Errorf("middleware: capture on topic %q: %w", msg.Topic, err)
	}
	return nil
}

// withHeader returns headers plus one more, always in a new backing array so the
// caller's slice is never written to.
func withHeader(headers []outbox.Header, key string, value []byte) []outbox.Header {
	out := make([]outbox.Header, len(headers), len(headers)+1)
	copy(out, headers)
	return append(out, outbox.Header{Key: key, Value: value})
}

// isContextErr reports a cancellation or deadline, which callers get back unwrapped.
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// idempotencyKey is the envelope's id in its canonical text form, built in one
// allocation.
func idempotencyKey(env *outbox.Envelope) []byte {
	text, _ := env.ID.MarshalText() // never fails
	return text
}
