// Package outbox is a storage-agnostic transactional outbox: an application's state
// change and the messages it sends commit together, and a dispatcher
// ([github.com/outboxkit/outbox/relay]) relays the messages to a broker afterwards.
//
// An application holds two small interfaces: a [Transactor] (every store is one) and
// a [Sender] ([NewSender] captures into a store):
//
//	err := store.Transact(ctx, func(ctx context.Context) error {
//		if err := saveOrder(ctx, order); err != nil { // reaches the store's tx from ctx
//			return err
//		}
//		return sender.Send(ctx, outbox.Message{Topic: "order-placed", Key: key, Payload: body})
//	})
//
// A send made with fn's ctx is staged on the unit's [Scope] and written in the same
// transaction when fn returns nil; if fn fails or panics, nothing is written. A send
// made outside any unit of work fails with [ErrNoTransaction], unless the sender's
// mode is [Immediate].
//
// This package holds the vocabulary every other package shares: messages and
// envelopes, the sender, the unit of work, the store and transport contracts, bucket
// hashing and the sentinel errors.
//
// # Semantics
//
//   - Delivery is at least once. A message can be published more than once (a relay
//     crashes after the broker acknowledged it but before the store forgot it, or a lease
//     moves while a publish is in flight); consumers deduplicate on the
//     [HeaderMessageID] or [HeaderIdempotencyKey] header.
//   - Order is kept per key: messages with one key land in one bucket, a bucket is relayed
//     by one relay at a time, in the order the store assigned ([Envelope.Seq]). For
//     writers that serialise their writes to a key, that is commit order.
//   - Keys, payloads and headers are bytes. Nothing in the relay path serialises or
//     re-encodes them.
//
// # Limitations
//
//   - An Immediate send outside a unit of work is durable but not atomic with any
//     write of the application's: the envelope and the state are two writes.
//   - Two uncoordinated transactions that write the same key have no defined order.
//   - Lease expiry compares host clocks; keep relay hosts synchronised to well within the
//     lease duration.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Header names the outbox reads or stamps.
const (
	// HeaderMessageID carries the envelope's ID on every published message.
	HeaderMessageID = "x-outbox-message-id"
	// HeaderIdempotencyKey is stamped by the transports at publish with the message ID
	// unless the application set one; consumers deduplicate on it.
	HeaderIdempotencyKey = "idempotency-key"
	// HeaderCorrelationID carries a correlation id across hops.
	HeaderCorrelationID = "x-correlation-id"
)

// DefaultBucketCount is the bucket count stores use unless configured otherwise.
const DefaultBucketCount = 8

// Header is one message header. Headers are ordered and a key may repeat, as in Kafka.
type Header struct {
	Key   string
	Value []byte
}

// Message is what an application sends.
type Message struct {
	// Topic names the destination: a Kafka topic, or a name a transport resolves to a
	// queue. Required.
	Topic string
	// Key orders messages: messages with one key are delivered in order. A nil key is
	// keyless; an empty, non-nil key is a real empty key.
	Key []byte
	// Payload is the message body. A nil payload is a tombstone.
	Payload []byte
	// Headers travel with the message in order.
	Headers []Header
	// Partition optionally pins the message to a Kafka partition. It also decides the
	// bucket (partition modulo the bucket count).
	Partition *int32
}

// Header returns the value of the last header named key, and whether there was one.
func (m *Message) Header(key string) ([]byte, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == key {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// Size is the number of bytes the message occupies: topic, key, payload and headers.
// Stores and transports compare it with their limits.
func (m *Message) Size() int {
	n := len(m.Topic) + len(m.Key) + len(m.Payload)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Validate reports whether the message can be captured.
func (m *Message) Validate() error {
	if m.Topic == "" {
		return fmt.Errorf("%w: message has no topic", ErrInvalidMessage)
	}
	if !validText(m.Topic) {
		return fmt.Errorf("%w: topic %q is not valid UTF-8 or holds a NUL byte", ErrInvalidMessage, m.Topic)
	}
	if m.Partition != nil && *m.Partition < 0 {
		return fmt.Errorf("%w: partition %d is negative", ErrInvalidMessage, *m.Partition)
	}
	for i, h := range m.Headers {
		if h.Key == "" {
			return fmt.Errorf("%w: header %d has an empty key", ErrInvalidMessage, i)
		}
		if !validText(h.Key) {
			return fmt.Errorf("%w: header key %q is not valid UTF-8 or holds a NUL byte", ErrInvalidMessage, h.Key)
		}
	}
	return nil
}

// validText reports whether s can be stored as text by every store: valid UTF-8
// with no NUL byte (PostgreSQL refuses both).
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// Status is where an envelope is in its life.
type Status int

const (
	// Pending envelopes wait to be published (possibly not yet due after a failure).
	Pending Status = iota
	// Parked envelopes failed permanently or ran out of attempts. They are never
	// deleted automatically; an operator requeues or purges them.
	Parked
	// Dispatched envelopes were published and are kept only while retention is on.
	Dispatched
)

func (s Status) String() string {
	switch s {
	case Pending:
		return "pending"
	case Parked:
		return "parked"
	case Dispatched:
		return "dispatched"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// Envelope is a captured message with the bookkeeping the relay needs.
type Envelope struct {
	// ID is a UUIDv7, published as the HeaderMessageID header.
	ID uuid.UUID
	Message
	// Bucket is the unit of ordering and of lease ownership; see [BucketOf].
	Bucket int
	// BucketCount is the writer's bucket count. A relay configured with another count
	// refuses to dispatch it ([ErrMisconfigured]).
	BucketCount int
	// Seq orders envelopes within a bucket. The store assigns it.
	Seq int64
	// CreatedAt is the capture time.
	CreatedAt time.Time
	// Attempts counts failed publish attempts.
	Attempts int
	// NextAttemptAt is when the envelope is due. Zero means now.
	NextAttemptAt time.Time
	Status        Status
	// LastError is the most recent publish failure.
	LastError string
	// DispatchedAt is set on envelopes kept by retention.
	DispatchedAt time.Time
}

// NewEnvelope builds a pending envelope for msg: it validates the message, gives it a
// fresh UUIDv7 and computes its bucket for bucketCount. The message's slices are not
// copied.
func NewEnvelope(msg Message, bucketCount int) (*Envelope, error) {
	if bucketCount < 1 {
		return nil, fmt.Errorf("%w: bucket count %d must be at least 1", ErrMisconfigured, bucketCount)
	}
	if err := msg.Validate(); err != nil {
		return nil, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("outbox: new message id: %w", err)
	}
	now := time.Now().UTC()
	return &Envelope{
		ID:          id,
		Message:     msg,
		Bucket:      BucketOf(&msg, id, bucketCount),
		BucketCount: bucketCount,
		CreatedAt:   now,
		Status:      Pending,
	}, nil
}

// Due reports whether the envelope may be published at now.
func (e *Envelope) Due(now time.Time) bool {
	return e.Status == Pending && !e.NextAttemptAt.After(now)
}

// Clone returns a deep copy, so stores can hand out envelopes callers may change.
func (e *Envelope) Clone() *Envelope {
	c := *e
	c.Key = cloneBytes(e.Key)
	c.Payload = cloneBytes(e.Payload)
	if e.Headers != nil {
		c.Headers = make([]Header, len(e.Headers))
		for i, h := range e.Headers {
			c.Headers[i] = Header{Key: h.Key, Value: cloneBytes(h.Value)}
		}
	}
	if e.Partition != nil {
		p := *e.Partition
		c.Partition = &p
	}
	return &c
}

// cloneBytes copies b, keeping nil and empty distinct.
func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// WriteMode says what a send made outside any unit of work does. Inside a unit of
// work ([Transactor.Transact]) every send joins the transaction, whatever the mode.
type WriteMode int

const (
	// Transactional refuses a send made outside a unit of work with [ErrNoTransaction]:
	// a message is written only together with the application's own write, so a
	// forgotten Transact is an error at Send, never a silent non-atomic write. The
	// default.
	Transactional WriteMode = iota
	// Immediate writes a send made outside a unit of work straight to the store with
	// [Store.Enqueue]: durable before Send returns, but not atomic with any write of
	// the application's. For sends that have no state change to go with.
	Immediate
)

func (m WriteMode) String() string {
	switch m {
	case Immediate:
		return "immediate"
	case Transactional:
		return "transactional"
	}
	return fmt.Sprintf("WriteMode(%d)", int(m))
}

// Sentinel errors. Adapters wrap them with %w; test with errors.Is.
var (
	// ErrNoTransaction: a Transactional send was made outside any unit of work.
	ErrNoTransaction = errors.New("outbox: transactional send outside a unit of work: send with the ctx that Transact passes to its function (not the ctx Transact was called with), or use outbox.Immediate for sends that need no transaction")
	// ErrMisconfigured: settings disagree (bucket counts, options, missing tables); the
	// relay stops.
	ErrMisconfigured = errors.New("outbox: misconfigured")
	// ErrNotFound: no envelope has the requested ID.
	ErrNotFound = errors.New("outbox: not found")
	// ErrClosed: the store, scope, unit of work or dispatcher was closed or has ended.
	ErrClosed = errors.New("outbox: closed")
	// ErrInvalidMessage: the message cannot be captured (no topic, a topic or header
	// key that is not valid UTF-8 or holds NUL, too large, ...). Nothing was written.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrTooLarge: a message or unit of work exceeds a store or transport limit.
	// errors.Is(err, ErrInvalidMessage) holds for it too. Nothing was written.
	ErrTooLarge error = tooLarge{}
	// ErrNoRoute: no route is registered for the topic.
	ErrNoRoute = errors.New("outbox: no route for topic")
)

type tooLarge struct{}

func (tooLarge) Error() string { return "outbox: too large" }
func (tooLarge) Unwrap() error { return ErrInvalidMessage }

// Store is what every store offers applications: a unit of work and a writer, both
// used by [Capture]. A store that wraps another (to add metrics, say) implements
// Unwrap() Store, so a capture built on the wrapper joins the inner store's units. Dispatchers need [DispatchStore]. Further capabilities
// ([Admin], [Notifier], [Finder], [Retainer], [Prober], [SizeLimiter]) are optional
// and found by type assertion.
type Store interface {
	Transactor
	// BucketCount is the store's configured bucket count. Envelopes written to it must
	// carry the same count.
	BucketCount() int
	// Enqueue writes envelopes all or nothing, in a transaction of its own, and assigns
	// their Seq. It refuses an envelope stamped with another bucket count
	// ([ErrMisconfigured]) and returns [ErrClosed] after Close.
	Enqueue(ctx context.Context, envs ...*Envelope) error
	// Close releases what the store holds (notification listeners, goroutines). It does
	// not close the client the caller passed in. Later calls return [ErrClosed].
	Close() error
}

// Queue is the store side of draining a bucket: fetch its head, then complete,
// reschedule or park what was published.
type Queue interface {
	// Fetch returns up to limit pending envelopes of one bucket in Seq order, including
	// envelopes that are not yet due (the dispatcher needs them to hold back later
	// messages of a blocked key). Parked and dispatched envelopes are not returned.
	Fetch(ctx context.Context, bucket, limit int) ([]*Envelope, error)
	// Complete forgets envelopes the broker acknowledged: it deletes them. It is
	// idempotent: completing an envelope that is gone is not an error.
	Complete(ctx context.Context, envs []*Envelope) error
	// Reschedule records a failed attempt: Attempts+1, NextAttemptAt=next, LastError=cause.
	Reschedule(ctx context.Context, env *Envelope, next time.Time, cause string) error
	// Park records a failure and parks the envelope; it is never retried automatically.
	Park(ctx context.Context, env *Envelope, cause string) error
}

// Lease is one bucket's lease as read from the store. Owner is empty for a free
// bucket. ExpiresAt doubles as the lease's version: renewals and releases are
// conditional on it. Lease times have microsecond precision.
type Lease struct {
	Bucket    int
	Owner     string
	ExpiresAt time.Time
}

// Free reports whether the lease can be claimed at now: no owner, or lapsed.
func (l Lease) Free(now time.Time) bool {
	return l.Owner == "" || !l.ExpiresAt.After(now)
}

// RelayRecord is one relay's heartbeat record.
type RelayRecord struct {
	ID       string
	LastSeen time.Time
	// StoppedAt is set once the relay stopped gracefully; peers stop counting it.
	StoppedAt time.Time
	// BucketCount is the bucket count the relay runs with, as of its last heartbeat;
	// 0 when unknown. Relays that see a peer with another count stop with
	// [ErrMisconfigured].
	BucketCount int
}

// Stopped reports whether the relay stamped itself stopped.
func (r RelayRecord) Stopped() bool { return !r.StoppedAt.IsZero() }

// Coordination is one consistent view of every lease and every relay record.
type Coordination struct {
	// Leases holds the stored leases, sorted by bucket. Buckets never leased are
	// absent; leases of buckets beyond the bucket count are dropped by the reader.
	Leases []Lease
	// Relays holds every relay record, sorted by ID.
	Relays []RelayRecord
}

// Leaser is the lease and heartbeat protocol dispatchers coordinate through: every
// write is conditional, and the returned bool says whether the condition held. A
// refused write is not an error. Times are truncated to microseconds by the caller; stores must
// round-trip them exactly.
type Leaser interface {
	// ReadCoordination reads every lease and relay record in one consistent read.
	ReadCoordination(ctx context.Context) (Coordination, error)
	// ReadRelays reads every relay record, sorted by ID. It may serve a slightly
	// stale copy (an eventually consistent read) and should cost one small read:
	// relays call it between rounds, every half PollInterval, to notice a peer joining
	// or stopping, and confirm with ReadCoordination.
	ReadRelays(ctx context.Context) ([]RelayRecord, error)
	// Heartbeat sets relay's LastSeen to at and its BucketCount to bucketCount,
	// creating the record if needed, only if the stored LastSeen is earlier than at.
	// It clears StoppedAt (a restart under the same ID).
	Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int) (bool, error)
	// StopRelay stamps the relay's record StoppedAt=at (and LastSeen=at if later), so a
	// heartbeat the relay abandoned cannot revive it.
	StopRelay(ctx context.Context, relay string, at time.Time) error
	// DeleteRelay deletes a relay record only if its LastSeen still equals lastSeen.
	DeleteRelay(ctx context.Context, relay string, lastSeen time.Time) (bool, error)
	// Claim takes a bucket for owner until expiresAt, only if the lease is absent, has
	// no owner, or expired at now.
	Claim(ctx context.Context, bucket int, owner string, now, expiresAt time.Time) (bool, error)
	// Renew extends held to expiresAt, only if the stored lease still names held.Owner
	// with expiry held.ExpiresAt, and that expiry is after now (an expired lease is
	// never revived by a renewal).
	Renew(ctx context.Context, held Lease, now, expiresAt time.Time) (bool, error)
	// Release frees held, only if the stored lease still names held.Owner with expiry
	// held.ExpiresAt.
	Release(ctx context.Context, held Lease) (bool, error)
}

// DispatchStore is everything a dispatcher needs.
type DispatchStore interface {
	Store
	Queue
	Leaser
}

// Admin is the optional operator surface.
type Admin interface {
	// List returns envelopes with the given status, ordered by bucket then Seq,
	// starting after the cursor (zero value: from the start), at most limit.
	List(ctx context.Context, status Status, after Cursor, limit int) ([]*Envelope, error)
	// Requeue makes parked envelopes pending again, due now, with Attempts reset. It
	// returns how many it changed; unknown or non-parked IDs are skipped.
	Requeue(ctx context.Context, ids ...uuid.UUID) (int, error)
	// Purge deletes the given envelopes whatever their status and returns how many.
	Purge(ctx context.Context, ids ...uuid.UUID) (int, error)
	// Stats samples the backlog.
	Stats(ctx context.Context) (Stats, error)
}

// Cursor is a position in List's order.
type Cursor struct {
	Bucket int
	Seq    int64
}

// After returns the cursor just past env, for paging through List.
func After(env *Envelope) Cursor { return Cursor{Bucket: env.Bucket, Seq: env.Seq} }

// Stats is a backlog sample.
type Stats struct {
	// Pending counts pending envelopes per bucket, each count capped at PendingLimit.
	Pending []int
	// PendingLimit is the cap per bucket; a bucket at the cap may hold more.
	PendingLimit int
	// Parked counts parked envelopes (capped like Pending where the store must count
	// item by item).
	Parked int
	// OldestPending is the CreatedAt of the oldest bucket head, zero when empty.
	OldestPending time.Time
}

// BacklogSampler is the optional capability a store offers when sampling its
// backlog needs more than [Admin.Stats], or when the store itself decides whether
// this instance samples. The relay holding bucket 0 calls it every
// dispatcher Config.BacklogInterval; stores without it are sampled through
// Admin.Stats.
type BacklogSampler interface {
	// SampleBacklog samples the backlog as Admin.Stats does. ok is false, with no
	// error, when the store declined to sample (it made no request): the DynamoDB
	// store samples only while the relay using it holds bucket 0.
	SampleBacklog(ctx context.Context) (stats Stats, ok bool, err error)
}

// Notifier is the optional wake-up capability: commits that wrote to a bucket are
// announced so a local dispatcher need not wait for its next poll. Wake-ups are a
// latency optimisation, never needed for correctness.
type Notifier interface {
	// Subscribe returns a channel of bucket numbers with new commits. Notifications
	// coalesce and never block the writer; the channel closes when ctx ends or the
	// store closes.
	Subscribe(ctx context.Context) <-chan int
}

// Finder is the optional lookup by ID, used by stream-triggered dispatch.
type Finder interface {
	// Find returns the envelope with id in any status, or [ErrNotFound].
	Find(ctx context.Context, id uuid.UUID) (*Envelope, error)
}

// Prober is the optional cheap idle check. A worker polling a bucket it holds asks
// it before a full Fetch, so an idle bucket costs the store one minimal read. The
// answer may come from a stale read: a wrong "no" delays the bucket to the next poll,
// it never loses a message (commit wake-ups skip the probe).
type Prober interface {
	// HasPending reports whether the bucket may hold pending envelopes.
	HasPending(ctx context.Context, bucket int) (bool, error)
}

// Retainer is the optional capability that keeps dispatched envelopes for a while.
type Retainer interface {
	// MarkDispatched marks envelopes dispatched at at instead of deleting them.
	// Idempotent like Complete.
	MarkDispatched(ctx context.Context, envs []*Envelope, at time.Time) error
	// DeleteDispatched deletes at most limit envelopes dispatched before before and
	// returns how many; callers loop until it returns fewer than limit.
	DeleteDispatched(ctx context.Context, before time.Time, limit int) (int, error)
}

// SizeLimiter is implemented by stores and transports with a per-message limit, so
// capture can refuse an oversized message before anything is written.
type SizeLimiter interface {
	// MaxMessageSize is the largest [Message.Size] accepted.
	MaxMessageSize() int
}

// Transport publishes envelopes to a broker.
type Transport interface {
	// Publish sends a batch and returns nil only when the broker durably acknowledged
	// every message. Otherwise it returns a [*PublishError] naming the messages that
	// failed (the others were acknowledged), or any other error meaning none may be
	// assumed sent. Wrap permanent causes with [Permanent]. Every message must carry
	// the [HeaderMessageID] header. Keys, payloads and headers pass through unchanged.
	Publish(ctx context.Context, batch []*Envelope) error
}

// KeyOrderKeeper is implemented by transports that never acknowledge an envelope
// after failing an earlier envelope of the same key in the same Publish call (they
// fail the key's whole tail). For them the dispatcher puts several envelopes of one
// key in one call; for other transports a call carries at most one envelope per key,
// so that a failure can still hold back its key's later envelopes.
type KeyOrderKeeper interface {
	KeepsKeyOrder() bool
}

// Pinger is implemented by transports that can check, without publishing, that they
// reach their broker. A dispatcher whose publishes keep failing asks it whether the
// broker or the messages are at fault: a relay that cannot reach its broker for
// longer than a lease hands its buckets to peers that can, and parks nothing for
// attempts it made while cut off. Ping returns nil when the broker answers.
type Pinger interface {
	Ping(ctx context.Context) error
}

// PublishError reports which messages of a batch failed.
type PublishError struct {
	Failed []MessageError
}

// MessageError is one message's failure.
type MessageError struct {
	ID  uuid.UUID
	Err error
}

func (e *PublishError) Error() string {
	if len(e.Failed) == 1 {
		return fmt.Sprintf("outbox: publish %s: %v", e.Failed[0].ID, e.Failed[0].Err)
	}
	return fmt.Sprintf("outbox: publish: %d messages failed, first %s: %v", len(e.Failed), e.Failed[0].ID, e.Failed[0].Err)
}

// Unwrap exposes every cause to errors.Is and errors.As.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

// permanentError marks a failure that retrying cannot fix.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks err as a failure that retrying cannot fix (message too large, unknown
// destination, not authorised): the dispatcher parks the message at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked [Permanent].
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}
