package driver

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Handle is implemented by what a store's constructor returns (beside
// [outbox.Store]): it hands the store's relay side to relays and tools, which take a
// Handle so that applications pass them the store itself.
type Handle interface {
	// Driver returns the store's relay side. Applications do not call it.
	Driver() Store
}

// Store is the relay side of a store: everything a relay needs, and the base the
// optional capabilities ([Admin], [Notifier], [Finder], [Prober], [Retainer],
// [BacklogSampler]) are found on by type assertion. A store's size limit
// ([SizeLimiter]) is found on its handle.
type Store interface {
	// BucketCount is the store's configured bucket count. Envelopes written to it
	// carry the same count.
	BucketCount() int
	// Enqueue writes envelopes all or nothing, in a transaction of its own, and
	// assigns their Seq. It refuses an envelope stamped with another bucket count
	// ([outbox.ErrMisconfigured]) and returns [outbox.ErrClosed] after Close.
	Enqueue(ctx context.Context, envs ...*Envelope) error
	// Check reports whether a relay can work on the store: its tables exist (it was
	// migrated) and its settings agree with what it finds there. It returns an error
	// wrapping [outbox.ErrMisconfigured] that names the fix (run Migrate, say) when
	// it cannot, and other errors when the store could not be reached. A relay calls
	// it at Start.
	Check(ctx context.Context) error
	Queue
	Leaser
}

// Queue is the store side of draining a bucket: fetch its head, then complete,
// reschedule or park what was published.
type Queue interface {
	// Fetch reads the head of one bucket: up to limit pending envelopes in Seq order,
	// including envelopes that are not yet due (the relay needs them to hold back
	// later messages of a blocked key). Parked and dispatched envelopes are not
	// returned. The batch says whether the bucket goes on past it ([Batch.More]): a
	// store may stop short of limit (DynamoDB stops before a sequence gap it did not
	// look into), so a short batch alone does not mean the bucket was drained.
	Fetch(ctx context.Context, bucket, limit int) (Batch, error)
	// Complete forgets envelopes the broker acknowledged: it deletes them. It is
	// idempotent: completing an envelope that is gone is not an error.
	Complete(ctx context.Context, envs []*Envelope) error
	// Reschedule records a failed attempt: Attempts+1, NextAttemptAt=next, LastError=cause.
	Reschedule(ctx context.Context, env *Envelope, next time.Time, cause string) error
	// Park records a failure and parks the envelope; it is never retried automatically.
	Park(ctx context.Context, env *Envelope, cause string) error
}

// Batch is what [Queue.Fetch] read of a bucket's head.
type Batch struct {
	// Envelopes are the bucket's first pending envelopes in Seq order, at most the
	// limit asked for.
	Envelopes []*Envelope
	// More reports that the bucket may hold pending envelopes past the last one
	// returned: the batch filled its limit, or the store cut it short (it stopped
	// before a part of the bucket it could not yet vouch for, such as a sequence gap
	// it did not probe; the next fetch goes on from there). A store that knows nothing
	// follows a full batch may leave More false. More false means the bucket held no
	// other pending envelope as of the read: the caller may take it for drained.
	//
	// A cut batch may hold no envelope at all (the store stopped before the first);
	// a store cuts only where fetching again makes progress, so a caller fetches again
	// at once. A caller that finds nothing to publish in a non-empty batch (every
	// envelope waits behind a backed-off one of its key) need not fetch again before
	// something changes, whatever More says.
	More bool
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
	// [outbox.ErrMisconfigured].
	BucketCount int
	// Instance is the process that wrote the last heartbeat; zero when unknown (a
	// record written by an older version, or only stamped stopped). A relay that finds
	// its own ID's record written by another live instance reports two processes
	// sharing one relay ID.
	Instance Instance
}

// Instance identifies one running relay process: its host, its process ID and a
// random nonce the relay draws each time it starts, so a restart on the same host
// (even with the same PID) is a new instance. Stores keep it as written, bounded by
// [MaxInstanceHost] and [MaxInstanceNonce].
type Instance struct {
	Host  string
	PID   int
	Nonce string
}

// Bounds of an [Instance]'s fields, in bytes, that every store must keep whole. A
// relay cuts a longer host name to MaxInstanceHost.
const (
	MaxInstanceHost  = 255
	MaxInstanceNonce = 64
)

// IsZero reports whether the instance is unknown.
func (i Instance) IsZero() bool { return i == Instance{} }

// String formats the instance as host/pid/nonce, as logs and tools show it.
func (i Instance) String() string {
	if i.IsZero() {
		return "unknown"
	}
	return fmt.Sprintf("%s/%d/%s", i.Host, i.PID, i.Nonce)
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

// Leaser is the lease and heartbeat protocol relays coordinate through: every
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
	// Heartbeat sets relay's LastSeen to at, its BucketCount to bucketCount and its
	// Instance to instance, creating the record if needed, only if the stored LastSeen
	// is earlier than at. It clears StoppedAt (a restart under the same ID).
	Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int, instance Instance) (bool, error)
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
	Stats(ctx context.Context) (Backlog, error)
}

// Cursor is a position in List's order.
type Cursor struct {
	Bucket int
	Seq    int64
}

// After returns the cursor just past env, for paging through List.
func After(env *Envelope) Cursor { return Cursor{Bucket: env.Bucket, Seq: env.Seq} }

// Backlog is a backlog sample.
type Backlog struct {
	// Pending counts pending envelopes per bucket, each count capped at PendingLimit.
	Pending []int
	// PendingLimit is the cap per bucket; a bucket at the cap may hold more.
	PendingLimit int
	// Parked counts parked envelopes (capped like Pending where the store must count
	// item by item).
	Parked int
	// OldestPending is the CreatedAt of the oldest bucket head, zero when empty.
	OldestPending time.Time
	// Stream is the lag of the store's stream ([Streamer]); nil for a store without one.
	Stream *StreamLag
}

// BacklogSampler is the optional capability a store offers when sampling its
// backlog needs more than [Admin.Stats], or when the store itself decides whether
// this instance samples. The relay holding bucket 0 calls it every
// relay Config.BacklogInterval; stores without it are sampled through
// Admin.Stats.
type BacklogSampler interface {
	// SampleBacklog samples the backlog as Admin.Stats does. ok is false, with no
	// error, when the store declined to sample (it made no request): the DynamoDB
	// store samples only while the relay using it holds bucket 0.
	SampleBacklog(ctx context.Context) (stats Backlog, ok bool, err error)
}

// Notifier is the optional wake-up capability: commits that wrote to a bucket are
// announced so a local relay need not wait for its next poll. Wake-ups are a
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

// SizeLimiter is implemented by store handles and transports with a per-message
// limit, so a sender can refuse an oversized message before anything is written.
type SizeLimiter interface {
	// MaxMessageSize is the largest [outbox.Message.Size] accepted.
	MaxMessageSize() int
}

// RelayIDChecker is implemented by relay sides that cannot record every relay ID (a
// column or key of bounded width): a relay asks when it is built, so an ID the store never
// could write fails there, not at the first heartbeat after Start.
type RelayIDChecker interface {
	// CheckRelayID returns an error saying why the store cannot record id, or nil.
	CheckRelayID(id string) error
}

// Metered is implemented by relay sides of stores that bill every request
// (DynamoDB). A relay on one spends fewer of the reads that only make it react
// sooner: alone in its fleet, it reads the relay records once between two rounds
// instead of every PollInterval/2, so a relay that joins takes its share within half
// a LeaseRenewInterval rather than half a second; with peers, whose stops it must
// notice at once, it reads as often as on any store.
type Metered interface {
	// Metered reports whether the store bills each request.
	Metered() bool
}

// StreamLease is the lease number of a store's stream reader ([Streamer]): the one
// relay of a fleet that reads the stream holds it, in the lease table beside the
// buckets' leases (0 to the bucket count − 1), through the [Leaser] calls. It is
// outside every bucket range, so bucket plans never count it.
const StreamLease = -1

// StreamPosition is a position in a store's stream: later positions are larger. Zero
// is no position.
type StreamPosition uint64

// Streamer is the optional capability of a store whose fast path writes its messages
// into a stream (PostgreSQL's write-ahead log, in the SQL store's log mode) rather
// than rows: the relay holding [StreamLease] reads them from it, and moves the
// messages whose publish keeps failing into the store's table with
// [Store.Enqueue], where they are drained as any other.
type Streamer interface {
	// OpenStream opens the stream at the last confirmed position: what was handed out
	// and not confirmed before comes again (at least once). A stream has one reader
	// at a time; opening it while another reader holds it fails.
	OpenStream(ctx context.Context) (Stream, error)
}

// Stream reads a store's stream. It is not safe for concurrent use.
type Stream interface {
	// Next returns the next envelopes in commit order (a transaction's in the order
	// they were sent) and the position just past them. It waits for a commit for up
	// to a short interval of the store's choosing and then returns no envelopes and a
	// zero position, so the caller may renew its lease and look at its stop signal.
	// An error other than ctx's means the stream is broken: close it and open
	// another.
	Next(ctx context.Context) ([]*Envelope, StreamPosition, error)
	// Confirm says every envelope handed out up to pos is settled (the broker
	// acknowledged it, or it was written to the store's table): the store may forget
	// the stream up to pos, and a stream opened later starts after it. Positions
	// only move forward; a lower one is ignored.
	Confirm(ctx context.Context, pos StreamPosition) error
	// Close ends the stream; what was not confirmed comes again to the next reader.
	Close(ctx context.Context) error
}

// StreamLag is how far a stream's confirmed position is behind its writers.
type StreamLag struct {
	// Bytes is how much of the stream the store keeps for its reader (PostgreSQL: the
	// write-ahead log between the slot's confirmed position and the current one).
	Bytes int64
	// Active reports whether a reader has the stream open.
	Active bool
	// Age is how long ago the reader last confirmed what was written, as far as the
	// store can tell (PostgreSQL: the slot's flush lag); zero when unknown or idle.
	Age time.Duration
}
