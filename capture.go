package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/internal/unit"
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

// SenderConfig configures the [Sender] that [NewSender] returns. The zero value is
// valid.
type SenderConfig struct {
	// Mode says what a send made outside any unit of work does. Defaults to
	// [Transactional]: it fails with [ErrNoTransaction]. A send made inside a unit of
	// work always joins its transaction, whatever the mode.
	Mode WriteMode
	// Transport is the transport the relays publish with, for its size limit: the
	// sender refuses a message over it before anything is written. Optional.
	Transport interface{ MaxMessageSize() int }
	// MaxMessageSize is the largest [Message.Size] the sender accepts. The store's
	// limit and Transport's apply too; the smallest wins. Defaults to 0: no limit of
	// its own.
	MaxMessageSize int
	// Logger receives reports of messages abandoned on a [NewScope] scope. Defaults
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

// capture is the Sender that turns each send into a stored message instead of a
// broker call.
type capture struct {
	store  Store
	owners []any // store and every store it wraps, as units of work name their owner
	mode   WriteMode
	limit  int // 0: none
	log    *slog.Logger
}

// NewSender returns the Sender that captures into store: inside a unit of work
// ([Transactor.Transact]) a send is staged and written in that transaction; outside
// one, SenderConfig.Mode decides. It does not take ownership of store. The Sender is
// safe for concurrent use.
//
// Each send is checked before anything is written: [Message.Validate], and its size
// against the smallest of the store's, the transport's and the configured limit
// ([ErrTooLarge]). A message with a zero ID gets a UUIDv7. Nothing is written when
// Send returns an error.
//
// Inside a unit of work of another store only, Send fails with [ErrMisconfigured]:
// the message could not be atomic with that transaction.
func NewSender(store Store, cfg SenderConfig) (Sender, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: outbox.NewSender: store is nil", ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &capture{store: store, mode: cfg.Mode, limit: cfg.MaxMessageSize, log: cfg.Logger}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.tighten(cfg.Transport)
	// Units of work name their store as their owner; a wrapper's units are its inner
	// store's. The types are checked here, once, so the send path compares safely.
	for s := Store(store); s != nil; {
		if reflect.TypeOf(s).Comparable() {
			c.owners = append(c.owners, s)
		}
		c.tighten(s)
		w, ok := s.(interface{ Unwrap() Store })
		if !ok {
			break
		}
		s = w.Unwrap()
	}
	return c, nil
}

// tighten lowers the limit to l's, if l has one.
func (c *capture) tighten(l any) {
	if sl, ok := l.(interface{ MaxMessageSize() int }); ok && sl != nil {
		if n := sl.MaxMessageSize(); n > 0 && (c.limit == 0 || n < c.limit) {
			c.limit = n
		}
	}
}

func (c *capture) Send(ctx context.Context, msg Message) error {
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
	if err := msg.Validate(); err != nil {
		return err
	}
	if c.limit > 0 {
		if n := msg.Size(); n > c.limit {
			return fmt.Errorf("%w: message for topic %q is %d bytes, over the limit of %d; nothing was written", ErrTooLarge, msg.Topic, n, c.limit)
		}
	}
	if msg.ID == uuid.Nil {
		if msg.ID, err = uuid.NewV7(); err != nil {
			return fmt.Errorf("outbox: new message id: %w", err)
		}
	}
	if scope != nil {
		return scope.Stage(ErrClosed, c.reportAbandoned, msg)
	}
	if err := c.store.Enqueue(ctx, msg); err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return fmt.Errorf("outbox: send on topic %q: %w", msg.Topic, err)
	}
	return nil
}

// scopeFor returns the scope a send with ctx joins: the innermost unit of work of
// c's store (found even with another store's unit inside it), else an application's
// own scope ([NewScope]) if it is the innermost, else nil. A ctx whose innermost unit
// of work belongs to another store is a wiring mistake.
func (c *capture) scopeFor(ctx context.Context) (*unit.Scope[Message], error) {
	for _, o := range c.owners {
		if s := unit.Find[Message](ctx, o); s != nil {
			return s, nil
		}
	}
	s := unit.From[Message](ctx)
	if s != nil && s.Owner != nil {
		return nil, fmt.Errorf("%w: outbox: send inside a unit of work of another store: build the sender with outbox.NewSender on the store whose Transact you call (a store that wraps another implements Unwrap() outbox.Store)", ErrMisconfigured)
	}
	return s, nil
}

func (c *capture) reportAbandoned(n int) {
	c.log.Warn("outbox: scope released with staged messages that no transaction took; they are discarded",
		"messages", n)
}
