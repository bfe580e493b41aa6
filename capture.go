package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync/atomic"
)

// Sender sends one message. Handlers depend on it; [NewSender] returns the one that
// captures into the outbox, and routers and middleware
// ([github.com/outboxkit/outbox/middleware]) implement it too.
type Sender interface {
	Send(ctx context.Context, msg Message) error
}

// SenderFunc adapts a function to [Sender].
type SenderFunc func(ctx context.Context, msg Message) error

// Send calls f.
func (f SenderFunc) Send(ctx context.Context, msg Message) error { return f(ctx, msg) }

// SenderConfig configures the [Capture] that [NewSender] returns. The zero value is
// valid.
type SenderConfig struct {
	// Mode says what a send made outside any unit of work does. Defaults to
	// [Transactional]: it fails with [ErrNoTransaction]. A send made inside a unit of
	// work always joins its transaction, whatever the mode.
	Mode WriteMode
	// Transport is the transport the relays publish with. If it implements
	// [SizeLimiter], capture refuses messages over its limit before anything is
	// written. Optional: a writer that builds no transport sets MaxMessageSize instead.
	Transport Transport
	// MaxMessageSize is the largest [Message.Size] capture accepts. The store's limit
	// ([SizeLimiter]) and Transport's apply too; the smallest wins. Defaults to 0: no
	// limit of its own.
	MaxMessageSize int
	// Logger receives reports of envelopes abandoned on a [NewScope] scope. Defaults
	// to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first setting that cannot work, naming its field.
func (c SenderConfig) Validate() error {
	switch c.Mode {
	case Transactional, Immediate:
	default:
		return fmt.Errorf("%w: outbox.SenderConfig.Mode %v is not outbox.Transactional or outbox.Immediate", ErrMisconfigured, c.Mode)
	}
	if c.MaxMessageSize < 0 {
		return fmt.Errorf("%w: outbox.SenderConfig.MaxMessageSize is %d; use 0 for no limit of its own", ErrMisconfigured, c.MaxMessageSize)
	}
	return nil
}

// Capture is the [Sender] that turns each send into an [Envelope] in a store instead
// of calling a broker. It is safe for concurrent use.
type Capture struct {
	store     Store
	mode      WriteMode
	buckets   int
	limit     int // 0: none
	log       *slog.Logger
	abandoned *atomic.Int64
}

// NewSender returns the Sender that captures into store: inside a unit of work
// ([Transactor.Transact]) a send is staged and written in that transaction; outside
// one, SenderConfig.Mode decides. It does not take ownership of store.
//
// Capture checks each message before anything is written: [Message.Validate], and its
// size against the smallest of the store's, the transport's and the configured limit
// ([ErrTooLarge]).
func NewSender(store Store, cfg SenderConfig) (*Capture, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: outbox.NewSender: store is nil", ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	buckets := store.BucketCount()
	if buckets < 1 {
		return nil, fmt.Errorf("%w: outbox.NewSender: the store reports %d buckets", ErrMisconfigured, buckets)
	}
	limit := cfg.MaxMessageSize
	for _, l := range []any{store, cfg.Transport} {
		if sl, ok := l.(SizeLimiter); ok {
			if n := sl.MaxMessageSize(); n > 0 && (limit == 0 || n < limit) {
				limit = n
			}
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Capture{store: store, mode: cfg.Mode, buckets: buckets, limit: limit, log: log, abandoned: new(atomic.Int64)}, nil
}

// MaxMessageSize is the limit capture enforces, 0 for none.
func (c *Capture) MaxMessageSize() int { return c.limit }

// Mode is the capture's write mode outside a unit of work.
func (c *Capture) Mode() WriteMode { return c.mode }

// WithMode returns a Capture that shares c's store, limits, logger and counter but
// uses mode outside a unit of work: a route that may send without a transaction
// registers c.WithMode(outbox.Immediate).
func (c *Capture) WithMode(mode WriteMode) (*Capture, error) {
	if err := (SenderConfig{Mode: mode}).Validate(); err != nil {
		return nil, err
	}
	d := *c
	d.mode = mode
	return &d, nil
}

// Abandoned counts envelopes this capture staged on a [NewScope] scope that was
// released without a transaction taking them. Units of work never abandon: a rolled
// back or panicking unit discards its sends quietly.
func (c *Capture) Abandoned() int64 { return c.abandoned.Load() }

// Send captures msg. Inside a unit of work of the capture's store (or on a
// [NewScope] scope) the envelope is staged and written by the transaction; outside
// one, [Immediate] writes it with [Store.Enqueue] before Send returns and
// [Transactional] fails with [ErrNoTransaction]. Inside a unit of work of another
// store only, Send fails with [ErrMisconfigured]. Nothing is written when Send
// returns an error.
func (c *Capture) Send(ctx context.Context, msg Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	scope, err := c.scopeFor(ctx)
	if err != nil {
		return err
	}
	if scope == nil && c.mode == Transactional {
		return fmt.Errorf("%w (topic %q)", ErrNoTransaction, msg.Topic)
	}
	env, err := NewEnvelope(msg, c.buckets)
	if err != nil {
		return err
	}
	if c.limit > 0 {
		if n := env.Size(); n > c.limit {
			return fmt.Errorf("%w: message for topic %q is %d bytes, over the limit of %d; nothing was written", ErrTooLarge, msg.Topic, n, c.limit)
		}
	}
	if scope != nil {
		return scope.stage(c.reportAbandoned, env)
	}
	if err := c.store.Enqueue(ctx, env); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("outbox: send on topic %q: %w", msg.Topic, err)
	}
	return nil
}

// scopeFor returns the scope a send with ctx joins: the unit of work of c's store
// (found even with another store's unit inside it), else an application's own scope
// ([NewScope]), else nil. A ctx whose innermost unit of work belongs to another
// store is a wiring mistake: the send could not be atomic with that transaction.
func (c *Capture) scopeFor(ctx context.Context) (*Scope, error) {
	for s := c.store; s != nil; {
		if reflect.TypeOf(s).Comparable() {
			if sc, ok := ctx.Value(unitKey{s}).(*Scope); ok {
				return sc, nil
			}
		}
		w, ok := s.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		s = w.Unwrap()
	}
	sc := ScopeFrom(ctx)
	if sc != nil && sc.owner != nil {
		return nil, fmt.Errorf("%w: outbox: send inside a unit of work of another store: build the sender with outbox.NewSender on the store whose Transact you call (a store that wraps another implements Unwrap() outbox.Store)", ErrMisconfigured)
	}
	return sc, nil
}

func (c *Capture) reportAbandoned(n int) {
	c.abandoned.Add(int64(n))
	c.log.Warn("outbox: scope released with staged messages that no transaction took; they are discarded",
		"messages", n)
}
