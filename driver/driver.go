// Package driver is the contract between the outbox and its adapters: what a store
// implements for the relay and the tools (the queue, the lease protocol, optional
// capabilities), what a transport implements, and the helpers every adapter shares
// (the unit-of-work runner, the wake-up hub, the header codec, envelopes and bucket
// hashing). It is modelled on database/sql/driver: application code does not import
// it, except to hand a store to a relay or a tool.
//
// # Stores
//
// A store's handle (what its constructor returns to applications) implements
// [outbox.Store] and [Handle]: its Driver method returns the [Store] the relay, the
// admin tools and the test suites use. Keeping the relay side behind Driver keeps the
// handle's documentation to what applications call. A store implements
// [outbox.Transactor] with [RunTransaction], so every store nests, commits and rolls
// back units of work alike; the suites in [github.com/outboxkit/outbox/outboxtest]
// check every store against this contract.
//
// A store whose fast path writes its messages into a stream rather than rows (the SQL
// store's log mode: PostgreSQL's write-ahead log) implements [Streamer] on its relay
// side. One relay of a fleet reads it, the one holding [StreamLease] in the lease
// table; it confirms a [StreamPosition] only once every envelope before it is settled,
// and writes what the broker keeps refusing into the store's table with
// [Store.Enqueue] (the table lane). [Backlog.Stream] reports the stream's lag.
//
// # Transports
//
// A transport implements [Transport] and, where it can, [SizeLimiter], [Pinger] and
// [KeyOrderKeeper].
package driver

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
)

// DefaultBucketCount is the bucket count stores use unless configured otherwise.
const DefaultBucketCount = 8

// ErrNotFound: no envelope has the requested ID.
var ErrNotFound = errors.New("outbox: not found")

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

// Envelope is a captured message with the bookkeeping the relay needs. Its ID is
// the message's ([outbox.Message.ID]), published as the [outbox.HeaderMessageID]
// header.
type Envelope struct {
	outbox.Message
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

// NewEnvelope builds a pending envelope for msg: it validates the message, keeps its
// ID or draws a UUIDv7 for a zero one, and computes its bucket for bucketCount. The
// message's slices are not copied.
func NewEnvelope(msg outbox.Message, bucketCount int) (*Envelope, error) {
	if bucketCount < 1 {
		return nil, fmt.Errorf("%w: bucket count %d must be at least 1", outbox.ErrMisconfigured, bucketCount)
	}
	if err := msg.Validate(); err != nil {
		return nil, err
	}
	if msg.ID == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("outbox: new message id: %w", err)
		}
		msg.ID = id
	}
	now := time.Now().UTC()
	return &Envelope{
		Message:     msg,
		Bucket:      BucketOf(&msg, bucketCount),
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
		c.Headers = make([]outbox.Header, len(e.Headers))
		for i, h := range e.Headers {
			c.Headers[i] = outbox.Header{Key: h.Key, Value: cloneBytes(h.Value)}
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
