package inbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// ErrDuplicate reports that a message's key is recorded already for the consumer:
// its effects were committed before. Stores return it (wrapped) from
// [Store.StageInboxKey] or from the commit of the unit of work; [Inbox.Process]
// turns it into a [Result] whose Duplicate is true and a nil error, since a
// duplicate is the expected outcome of at-least-once delivery and must be
// acknowledged like a success.
var ErrDuplicate = errors.New("inbox: message already processed by this consumer")

// Defaults of [Config].
const (
	// DefaultRetention is how long a key is kept: 7 days.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultRemoveBatch is how many expired keys one removal statement deletes.
	DefaultRemoveBatch = 1000
	// MaxKeyLength is the longest key stored as is, in bytes. A longer key, or one
	// that is not valid UTF-8, is stored as "sha256:" and the hex of its SHA-256.
	MaxKeyLength = 200
	// MaxConsumerLength is the longest consumer name, in bytes.
	MaxConsumerLength = 100
)

// Key is one inbox record: a message's key under a consumer name, kept until
// ExpiresAt.
type Key struct {
	// Consumer is the consumer name ([Config.Consumer]).
	Consumer string
	// ID is the message's key: valid UTF-8 of at most [MaxKeyLength] bytes.
	ID string
	// ExpiresAt is when retention may remove the record (UTC). Until it is removed,
	// the key counts as recorded, even past ExpiresAt.
	ExpiresAt time.Time
}

// Store is what an inbox needs of a store's relay side ([driver.Handle]'s Driver),
// beside the handle's unit of work: a way to record a key in that unit. The stores of
// this module implement it (memstore, sqlstore, gormstore, dynamostore); an inbox
// finds it by type assertion.
type Store interface {
	// StageInboxKey records key in the unit of work open on ctx (the ctx that
	// Transact passes to its function), so that it commits with the unit's other
	// writes or not at all. The inbox calls it first in the unit, before the
	// consumer's function.
	//
	// When the key is recorded already (committed by an earlier unit), it returns an
	// error wrapping [ErrDuplicate]. A store that can only know for sure at commit
	// (a racing unit may record the same key meanwhile) makes the commit fail
	// instead: either with an error wrapping ErrDuplicate, or with an error that the
	// returned duplicate function recognises (it may be nil). Whatever the store, a
	// unit whose key was recorded by another commits none of its writes.
	StageInboxKey(ctx context.Context, key Key) (duplicate func(commitErr error) bool, err error)
}

// Remover is the optional capability of a store (on its relay side, like [Store])
// whose keys are removed by the
// application rather than by the database itself (DynamoDB's TTL): SQL and memory.
type Remover interface {
	// RemoveInboxKeys deletes at most limit keys whose ExpiresAt is before before,
	// of every consumer, and returns how many it deleted.
	RemoveInboxKeys(ctx context.Context, before time.Time, limit int) (int, error)
}

// Config configures an [Inbox].
type Config struct {
	// Consumer names the consumer whose effects the inbox applies once: keys are
	// recorded per consumer, so two consumers of one message each apply it once.
	// Required; valid UTF-8 of at most [MaxConsumerLength] bytes. Keep it stable
	// across deploys: a renamed consumer applies every message again.
	Consumer string
	// Retention is how long a key is kept after its message was processed: a
	// redelivery within it is a duplicate; one after the key was removed is
	// processed again. Defaults to DefaultRetention (7 days).
	Retention time.Duration
	// KeyFunc derives the key of a message that carries neither an
	// [outbox.HeaderIdempotencyKey] nor an [outbox.HeaderMessageID] header (one not
	// published through the outbox). Defaults to nil: such a message is refused with
	// [outbox.ErrInvalidMessage].
	KeyFunc func(msg *outbox.Message) (string, error)
	// RemoveBatch is how many keys one removal statement of [Inbox.RemoveExpired]
	// deletes. Defaults to DefaultRemoveBatch (1000).
	RemoveBatch int
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger receives removal summaries. Defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c Config) Validate() error {
	switch {
	case c.Consumer == "":
		return fmt.Errorf("%w: inbox: Config.Consumer is required: name the consumer (\"billing\"), so its keys are kept apart from other consumers'", outbox.ErrMisconfigured)
	case len(c.Consumer) > MaxConsumerLength:
		return fmt.Errorf("%w: inbox: Config.Consumer is %d bytes, over %d: use a shorter name", outbox.ErrMisconfigured, len(c.Consumer), MaxConsumerLength)
	case !utf8.ValidString(c.Consumer):
		return fmt.Errorf("%w: inbox: Config.Consumer %q is not valid UTF-8", outbox.ErrMisconfigured, c.Consumer)
	case c.Retention < 0:
		return fmt.Errorf("%w: inbox: Config.Retention %v is negative: use 0 for the default (%v) or a positive window", outbox.ErrMisconfigured, c.Retention, DefaultRetention)
	case c.RemoveBatch < 0:
		return fmt.Errorf("%w: inbox: Config.RemoveBatch %d is negative: use 0 for the default (%d) or a positive size", outbox.ErrMisconfigured, c.RemoveBatch, DefaultRemoveBatch)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.RemoveBatch == 0 {
		c.RemoveBatch = DefaultRemoveBatch
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Inbox applies the effects of each received message once per consumer: see the
// package documentation.
type Inbox struct {
	uow   outbox.Transactor
	store Store
	cfg   Config
}

// New returns an inbox on store, whose relay side must implement [Store] (every
// store of this module does). It fails with an error wrapping
// [outbox.ErrMisconfigured] when it does not, or cfg is invalid.
func New(store outbox.Transactor, cfg Config) (*Inbox, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: inbox: New needs a store: pass the store whose unit of work the consumer writes in", outbox.ErrMisconfigured)
	}
	var st Store
	if h, ok := store.(driver.Handle); ok {
		st, _ = h.Driver().(Store)
	}
	if st == nil {
		return nil, fmt.Errorf("%w: inbox: the store %T cannot record inbox keys in its unit of work (its Driver has no StageInboxKey method): use a store of this module (memstore, sqlstore, gormstore, dynamostore) or implement inbox.Store", outbox.ErrMisconfigured, store)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Inbox{uow: store, store: st, cfg: cfg.withDefaults()}, nil
}

// Consumer returns the consumer name.
func (in *Inbox) Consumer() string { return in.cfg.Consumer }

// Result says what [Inbox.Process] did with a message.
type Result struct {
	// Key is the key the message was recorded under.
	Key string
	// Duplicate is true when the key was recorded already: the function did not run,
	// or ran and its writes were discarded, and the message must be acknowledged.
	Duplicate bool
}

// Process applies msg's effects once: it runs fn in the store's unit of work,
// together with the insert of msg's key under the consumer name. fn writes through
// the store's accessors with the ctx it is given (sqlstore.PgxTx, sqlstore.SQLTx,
// gormstore.Tx, dynamostore.AddItems, memstore.OnCommit), and every message it sends
// with that ctx through an outbox sender joins the unit: the key, fn's writes and
// its messages commit together or not at all.
//
// The key is the last [outbox.HeaderIdempotencyKey] header, else the last
// [outbox.HeaderMessageID] header, else what [Config.KeyFunc] returns; a message
// with none fails with [outbox.ErrInvalidMessage].
//
// When the key is recorded already, fn does not run and Process returns a Result
// whose Duplicate is true and a nil error: acknowledge the message. When a racing
// unit records the key first, fn may have run; its writes are discarded and the
// result is a duplicate all the same. When fn returns an error or panics, nothing
// is recorded, the error is returned as is (the panic goes on), and a redelivery
// runs fn again. A failed commit is returned as an error: nothing was recorded.
func (in *Inbox) Process(ctx context.Context, msg *outbox.Message, fn func(ctx context.Context) error) (Result, error) {
	if fn == nil {
		return Result{}, fmt.Errorf("%w: inbox: Process needs a function to run", outbox.ErrMisconfigured)
	}
	id, err := in.Key(msg)
	if err != nil {
		return Result{}, err
	}
	res := Result{Key: id}
	key := Key{Consumer: in.cfg.Consumer, ID: id, ExpiresAt: in.cfg.Now().Add(in.cfg.Retention).UTC()}
	var isDup func(error) bool
	staged := false
	err = in.uow.Transact(ctx, func(ctx context.Context) error {
		dup, err := in.store.StageInboxKey(ctx, key)
		if err != nil {
			return err
		}
		isDup, staged = dup, true
		return fn(ctx)
	})
	switch {
	case err == nil:
		return res, nil
	case errors.Is(err, ErrDuplicate), staged && isDup != nil && isDup(err):
		res.Duplicate = true
		return res, nil
	}
	return res, err
}

// Key returns the key msg is recorded under: see [Inbox.Process].
func (in *Inbox) Key(msg *outbox.Message) (string, error) {
	if msg == nil {
		return "", fmt.Errorf("%w: inbox: no message", outbox.ErrInvalidMessage)
	}
	for _, h := range []string{outbox.HeaderIdempotencyKey, outbox.HeaderMessageID} {
		if v, ok := msg.Header(h); ok && len(v) > 0 {
			return normalize(string(v)), nil
		}
	}
	if in.cfg.KeyFunc == nil {
		return "", fmt.Errorf("%w: inbox: the message on topic %q has no %s or %s header: publish it through the outbox, or set Config.KeyFunc to derive its key", outbox.ErrInvalidMessage, msg.Topic, outbox.HeaderIdempotencyKey, outbox.HeaderMessageID)
	}
	id, err := in.cfg.KeyFunc(msg)
	if err != nil {
		return "", fmt.Errorf("inbox: Config.KeyFunc: %w", err)
	}
	if id == "" {
		return "", fmt.Errorf("%w: inbox: Config.KeyFunc returned an empty key for a message on topic %q", outbox.ErrInvalidMessage, msg.Topic)
	}
	return normalize(id), nil
}

// normalize keeps a key every store can hold as a short string.
func normalize(id string) string {
	if len(id) <= MaxKeyLength && utf8.ValidString(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// RemoveExpired removes the keys, of every consumer, whose retention has passed, in
// batches of [Config.RemoveBatch], until none is left; it returns how many it
// removed. Call it periodically (hourly, say) from one process or several. On a
// store that removes keys by itself (DynamoDB's TTL) it does nothing and returns 0.
// A cancelled ctx stops it between batches; what was removed stays removed.
func (in *Inbox) RemoveExpired(ctx context.Context) (int, error) {
	r, ok := in.store.(Remover)
	if !ok {
		return 0, nil
	}
	before := in.cfg.Now().UTC()
	total := 0
	for {
		n, err := r.RemoveInboxKeys(ctx, before, in.cfg.RemoveBatch)
		total += n
		if err != nil {
			return total, err
		}
		if n < in.cfg.RemoveBatch {
			if total > 0 {
				in.cfg.Logger.DebugContext(ctx, "inbox: removed expired keys", "removed", total)
			}
			return total, nil
		}
	}
}
