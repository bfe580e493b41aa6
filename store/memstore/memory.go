// Package memstore is an in-memory outbox store: the whole store contract of package
// outbox, held in one process's memory.
//
// It is the reference store. It serves tests, demos and single-process tools, and every
// conformance test in package outboxtest runs against it first. Its unit of work,
// [Store.Transact], behaves as every store's does, so a service's handler written
// against [outbox.Transactor] and [outbox.Sender] runs on it in tests unchanged, and
// [OnCommit] lets a test double of the application's repository commit with it.
//
// # Semantics
//
//   - Every call is safe for concurrent use. Writes are serialised by one lock, so each
//     Enqueue, Transact commit and relay call is atomic and sees a single consistent state.
//   - Seq is strictly increasing within a bucket, in commit order.
//   - An envelope ID is stored once: writing an ID the store still holds is refused
//     with [outbox.ErrInvalidMessage], and the whole write with it.
//   - The store keeps its own copies: envelopes passed in are cloned on the way in,
//     envelopes handed out are clones, so callers may change either freely.
//   - Subscribers ([Store.Subscribe]) are woken after every commit that wrote to a
//     bucket; a wake-up is never needed for correctness.
//   - Lease writes are conditional exactly as [driver.Leaser] describes. Times are stored
//     as given (in UTC) and compared with [time.Time.Equal].
//   - After [Store.Close] every call returns an error wrapping [outbox.ErrClosed]; a
//     cancelled context makes any call return the context's error unwrapped.
//
// # Limitations
//
//   - Single process: relays in other processes cannot see the store, so the lease
//     protocol only coordinates dispatchers that share this Store value.
//   - Not durable: everything is lost when the process exits. Immediate mode is
//     therefore only as durable as the process.
//   - Admin listing sorts the matching envelopes on every call; it is meant for tests
//     and small backlogs.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// DefaultMaxMessageSize is the per-message limit unless [Config.MaxMessageSize] says
// otherwise: 1 MiB, the largest message SQS accepts.
const DefaultMaxMessageSize = 1 << 20

// Config configures a [Store]. The zero value is valid.
type Config struct {
	// BucketCount is the number of buckets. Envelopes must be stamped with the same
	// count. Defaults to [driver.DefaultBucketCount].
	BucketCount int
	// MaxMessageSize is the largest [outbox.Message.Size] the store accepts; larger
	// messages are refused with [outbox.ErrTooLarge]. Defaults to
	// [DefaultMaxMessageSize].
	MaxMessageSize int
}

func (c Config) withDefaults() Config {
	if c.BucketCount == 0 {
		c.BucketCount = driver.DefaultBucketCount
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	return c
}

// Validate reports the first setting that cannot work, naming its field. Zero values
// are valid: they take their defaults.
func (c Config) Validate() error {
	if c.BucketCount < 0 {
		return fmt.Errorf("%w: memstore: Config.BucketCount is %d; it must be at least 1 (or 0 for the default %d)",
			outbox.ErrMisconfigured, c.BucketCount, driver.DefaultBucketCount)
	}
	if c.MaxMessageSize < 0 {
		return fmt.Errorf("%w: memstore: Config.MaxMessageSize is %d; it must be positive (or 0 for the default %d)",
			outbox.ErrMisconfigured, c.MaxMessageSize, DefaultMaxMessageSize)
	}
	return nil
}

// Store is an in-memory outbox store. Applications send into it ([outbox.NewSender])
// and run units of work on it ([Store.Transact]); relays and tools reach its relay
// side through [Store.Driver].
type Store struct {
	bucketCount int
	maxSize     int
	hub         driver.Hub

	mu      sync.Mutex
	closed  bool
	byID    map[uuid.UUID]*entry
	buckets []bucket
	parked  int
	// dispatched holds entries marked dispatched, in marking order, for the retention
	// sweep; entries that left the dispatched state are dropped lazily.
	dispatched []*entry
	leases     map[int]driver.Lease
	relays     map[string]driver.RelayRecord
}

// entry is one stored envelope.
type entry struct {
	env *driver.Envelope
	// queued says the entry sits in its bucket's queue (possibly no longer pending).
	queued  bool
	deleted bool
}

func (e *entry) live() bool { return !e.deleted && e.env.Status == driver.Pending }

// bucket holds one bucket's pending envelopes in Seq order. Entries that stopped being
// pending stay in the queue until the head passes them or compaction drops them, so
// completing, parking and dispatching never shift the slice.
type bucket struct {
	queue   []*entry
	dead    int // queued entries that are no longer live
	nextSeq int64
}

// New returns an empty store.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Store{
		bucketCount: cfg.BucketCount,
		maxSize:     cfg.MaxMessageSize,
		byID:        make(map[uuid.UUID]*entry),
		buckets:     make([]bucket, cfg.BucketCount),
		leases:      make(map[int]driver.Lease),
		relays:      make(map[string]driver.RelayRecord),
	}, nil
}

// driverStore is the store's relay side: a [driver.Store] that also implements
// [driver.Admin], [driver.Notifier], [driver.Finder], [driver.Retainer] and the
// inbox's key store.
type driverStore struct{ *Store }

var (
	_ driver.Handle      = (*Store)(nil)
	_ driver.SizeLimiter = (*Store)(nil)
	_ driver.Store       = driverStore{}
	_ driver.Admin       = driverStore{}
	_ driver.Notifier    = driverStore{}
	_ driver.Finder      = driverStore{}
	_ driver.Retainer    = driverStore{}
)

// Driver returns the store's relay side, for relays, the inbox and tools;
// applications do not call it.
func (s *Store) Driver() driver.Store { return driverStore{s} }

var errClosed = fmt.Errorf("memstore: %w", outbox.ErrClosed)

// lock checks ctx, takes the lock and checks the store is open. On a nil error the
// caller holds the lock.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errClosed
	}
	return nil
}

// BucketCount returns the configured bucket count.
func (s driverStore) BucketCount() int { return s.bucketCount }

// MaxMessageSize returns the configured per-message limit.
func (s *Store) MaxMessageSize() int { return s.maxSize }

// Close makes every later call return [outbox.ErrClosed] and closes every
// subscription. What the store held stays unreachable until the Store is garbage
// collected. Closing twice is a no-op.
func (s *Store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.hub.Close()
	return nil
}

// Subscribe returns a channel of buckets that received commits; see [driver.Notifier].
func (s driverStore) Subscribe(ctx context.Context) <-chan int { return s.hub.Subscribe(ctx) }

// Enqueue writes messages all or nothing, as pending envelopes; a message with a
// zero ID gets one.
func (s *Store) Enqueue(ctx context.Context, msgs ...outbox.Message) error {
	envs, err := driver.NewEnvelopes(msgs, s.bucketCount)
	if err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	return s.write(ctx, envs, nil)
}

// Enqueue writes envelopes all or nothing and sets their Seq. They are stored as
// pending, whatever their Status.
func (s driverStore) Enqueue(ctx context.Context, envs ...*driver.Envelope) error {
	return s.write(ctx, envs, nil)
}

// Transact runs fn as a unit of work (see [outbox.Transactor]): the sends made with
// fn's ctx are written together, as one atomic write, when fn returns nil, and
// discarded when it fails or panics. A Transact inside another on the same store is
// a savepoint: when it fails, its sends and the state changes it registered with
// [OnCommit] are dropped and the outer unit goes on.
//
// The memory store holds no application state, so the transaction covers the
// messages (and what [OnCommit] registers) only; in a service's tests that is what
// makes a failed unit of work publish nothing, exactly as on a database.
func (s *Store) Transact(ctx context.Context, fn func(ctx context.Context) error) error {
	return driver.RunTransaction(ctx, driver.Unit{Owner: s, BucketCount: s.bucketCount, Begin: s.begin}, fn)
}

func (s *Store) begin(ctx context.Context) (driver.Tx, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	s.mu.Unlock()
	return &tx{s: s}, nil
}

// tx is a memory unit of work: everything happens at commit, under the store's lock.
type tx struct {
	s       *Store
	mu      sync.Mutex
	applies []func() error
}

// Savepoint marks how many state changes the unit has registered.
func (t *tx) Savepoint(context.Context) (driver.Savepoint, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return savepoint{t, len(t.applies)}, nil
}

type savepoint struct {
	t *tx
	n int
}

func (savepoint) Release(context.Context) error { return nil }

// Rollback drops the state changes registered since the mark.
func (sp savepoint) Rollback(context.Context) error {
	sp.t.mu.Lock()
	defer sp.t.mu.Unlock()
	sp.t.applies = sp.t.applies[:sp.n]
	return nil
}

// OnCommit registers apply, an application state change, with the unit of work on
// ctx. At commit, apply runs under the store's lock, after the messages were checked
// and before they are stored; if it returns an error the unit fails with that error
// and nothing is stored (state changes that earlier applies of the unit made are the
// caller's to undo). If the unit rolls back, apply never runs. apply must not call
// the store.
//
// It lets a test double of the application's repository be as atomic with the
// messages as the real database is. OnCommit fails with [outbox.ErrNoTransaction]
// outside a unit of work of a memory store.
func OnCommit(ctx context.Context, apply func() error) error {
	t, ok := driver.TxFrom[*tx](ctx)
	if !ok {
		return fmt.Errorf("memstore.OnCommit: %w", outbox.ErrNoTransaction)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.applies = append(t.applies, apply)
	return nil
}

func (t *tx) Commit(ctx context.Context, envs []*driver.Envelope) error {
	t.mu.Lock()
	applies := t.applies
	t.mu.Unlock()
	return t.s.write(ctx, envs, func() error {
		for _, apply := range applies {
			if err := apply(); err != nil {
				return err
			}
		}
		return nil
	})
}

func (*tx) Rollback(context.Context) {}

// write validates envs, runs apply and stores envs, all under the lock.
func (s *Store) write(ctx context.Context, envs []*driver.Envelope, apply func() error) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	if err := s.check(envs); err != nil {
		s.mu.Unlock()
		return err
	}
	if apply != nil {
		if err := apply(); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	if len(envs) == 0 {
		s.mu.Unlock()
		return nil
	}
	touched := make([]int, 0, min(len(envs), s.bucketCount))
	for _, env := range envs {
		b := &s.buckets[env.Bucket]
		b.nextSeq++
		env.Seq = b.nextSeq
		stored := env.Clone()
		stored.CreatedAt = stored.CreatedAt.UTC()
		stored.NextAttemptAt = stored.NextAttemptAt.UTC()
		stored.Status = driver.Pending
		stored.DispatchedAt = time.Time{}
		e := &entry{env: stored, queued: true}
		s.byID[stored.ID] = e
		b.queue = append(b.queue, e)
		if !slices.Contains(touched, env.Bucket) {
			touched = append(touched, env.Bucket)
		}
	}
	s.mu.Unlock()
	s.hub.Notify(touched...)
	return nil
}

// check refuses a batch that cannot be stored as a whole. Called with the lock held.
func (s *Store) check(envs []*driver.Envelope) error {
	var seen map[uuid.UUID]struct{}
	if len(envs) > 1 {
		seen = make(map[uuid.UUID]struct{}, len(envs))
	}
	for i, env := range envs {
		if env == nil {
			return fmt.Errorf("%w: memstore: envelope %d is nil", outbox.ErrInvalidMessage, i)
		}
		if env.BucketCount != s.bucketCount {
			return fmt.Errorf("%w: memstore: envelope %s was stamped for %d buckets but the store has %d; give the writer and the store the same bucket count",
				outbox.ErrMisconfigured, env.ID, env.BucketCount, s.bucketCount)
		}
		if env.Bucket < 0 || env.Bucket >= s.bucketCount {
			return fmt.Errorf("%w: memstore: envelope %s has bucket %d outside 0..%d", outbox.ErrInvalidMessage, env.ID, env.Bucket, s.bucketCount-1)
		}
		if env.ID == uuid.Nil {
			return fmt.Errorf("%w: memstore: envelope %d has no ID; build envelopes with driver.NewEnvelope", outbox.ErrInvalidMessage, i)
		}
		if err := env.Validate(); err != nil {
			return fmt.Errorf("memstore: envelope %s: %w", env.ID, err)
		}
		if size := env.Size(); size > s.maxSize {
			return fmt.Errorf("%w: memstore: envelope %s is %d bytes, over the store's limit of %d", outbox.ErrTooLarge, env.ID, size, s.maxSize)
		}
		if _, ok := s.byID[env.ID]; ok {
			return fmt.Errorf("%w: memstore: envelope %s is already stored", outbox.ErrInvalidMessage, env.ID)
		}
		if seen != nil {
			if _, ok := seen[env.ID]; ok {
				return fmt.Errorf("%w: memstore: envelope %s appears twice in one write", outbox.ErrInvalidMessage, env.ID)
			}
			seen[env.ID] = struct{}{}
		}
	}
	return nil
}

func (s *Store) checkBucket(bucket int) error {
	if bucket < 0 || bucket >= s.bucketCount {
		return fmt.Errorf("%w: memstore: bucket %d outside 0..%d", outbox.ErrMisconfigured, bucket, s.bucketCount-1)
	}
	return nil
}

// Fetch returns up to limit pending envelopes of bucket in Seq order, due or not.
// The memory store never cuts a batch: More is set only when a pending envelope
// follows the last one returned.
func (s driverStore) Fetch(ctx context.Context, bucketNo, limit int) (driver.Batch, error) {
	if err := s.checkBucket(bucketNo); err != nil {
		return driver.Batch{}, err
	}
	if err := s.lock(ctx); err != nil {
		return driver.Batch{}, err
	}
	defer s.mu.Unlock()
	b := &s.buckets[bucketNo]
	b.trimHead()
	if limit <= 0 {
		return driver.Batch{More: len(b.queue) > 0}, nil
	}
	out := driver.Batch{Envelopes: make([]*driver.Envelope, 0, min(limit, len(b.queue)-b.dead))}
	for _, e := range b.queue {
		if !e.live() {
			continue
		}
		if len(out.Envelopes) == limit {
			out.More = true
			break
		}
		out.Envelopes = append(out.Envelopes, e.env.Clone())
	}
	return out, nil
}

// trimHead drops entries that are no longer live from the front of the queue.
func (b *bucket) trimHead() {
	for len(b.queue) > 0 && !b.queue[0].live() {
		b.queue[0].queued = false
		b.queue[0] = nil
		b.queue = b.queue[1:]
		b.dead--
	}
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
}

// died records that a queued entry stopped being live, compacting when the queue is
// mostly dead. Called with the lock held, after the entry's state changed.
func (s *Store) died(e *entry) {
	if !e.queued {
		return
	}
	b := &s.buckets[e.env.Bucket]
	b.dead++
	if b.dead > 64 && b.dead > len(b.queue)/2 {
		kept := make([]*entry, 0, len(b.queue)-b.dead)
		for _, q := range b.queue {
			if q.live() {
				kept = append(kept, q)
			} else {
				q.queued = false
			}
		}
		b.queue, b.dead = kept, 0
	}
}

// revived puts an entry that became pending again back in its bucket's queue.
func (s *Store) revived(e *entry) {
	b := &s.buckets[e.env.Bucket]
	if e.queued {
		b.dead--
		return
	}
	i, _ := slices.BinarySearchFunc(b.queue, e.env.Seq, func(q *entry, seq int64) int {
		switch {
		case q.env.Seq < seq:
			return -1
		case q.env.Seq > seq:
			return 1
		}
		return 0
	})
	b.queue = slices.Insert(b.queue, i, e)
	e.queued = true
}

// remove deletes an entry in any state. Called with the lock held.
func (s *Store) remove(e *entry) {
	wasLive := e.live()
	if e.env.Status == driver.Parked {
		s.parked--
	}
	e.deleted = true
	delete(s.byID, e.env.ID)
	if wasLive {
		s.died(e)
	}
}

// Complete deletes envelopes; unknown IDs are skipped.
func (s driverStore) Complete(ctx context.Context, envs []*driver.Envelope) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for _, env := range envs {
		if e, ok := s.byID[env.ID]; ok {
			s.remove(e)
		}
	}
	return nil
}

// Reschedule records a failed attempt. An envelope that is gone is skipped.
func (s driverStore) Reschedule(ctx context.Context, env *driver.Envelope, next time.Time, cause string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	e, ok := s.byID[env.ID]
	if !ok {
		return nil
	}
	e.env.Attempts++
	e.env.NextAttemptAt = next.UTC()
	e.env.LastError = cause
	return nil
}

// Park records a failed attempt and parks the envelope. An envelope that is gone is
// skipped.
func (s driverStore) Park(ctx context.Context, env *driver.Envelope, cause string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	e, ok := s.byID[env.ID]
	if !ok {
		return nil
	}
	e.env.Attempts++
	e.env.LastError = cause
	if e.env.Status == driver.Parked {
		return nil
	}
	wasLive := e.live()
	e.env.Status = driver.Parked
	e.env.DispatchedAt = time.Time{}
	s.parked++
	if wasLive {
		s.died(e)
	}
	return nil
}

// MarkDispatched marks envelopes dispatched at at instead of deleting them. Unknown
// IDs are skipped.
func (s driverStore) MarkDispatched(ctx context.Context, envs []*driver.Envelope, at time.Time) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	at = at.UTC()
	for _, env := range envs {
		e, ok := s.byID[env.ID]
		if !ok || e.env.Status == driver.Dispatched {
			continue
		}
		wasLive := e.live()
		if e.env.Status == driver.Parked {
			s.parked--
		}
		e.env.Status = driver.Dispatched
		e.env.DispatchedAt = at
		s.dispatched = append(s.dispatched, e)
		if wasLive {
			s.died(e)
		}
	}
	return nil
}

// DeleteDispatched deletes at most limit envelopes dispatched before before.
func (s driverStore) DeleteDispatched(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	kept := s.dispatched[:0]
	for _, e := range s.dispatched {
		switch {
		case e.deleted || e.env.Status != driver.Dispatched:
			// left the dispatched state; forget it
		case n < limit && e.env.DispatchedAt.Before(before):
			s.remove(e)
			n++
		default:
			kept = append(kept, e)
		}
	}
	clear(s.dispatched[len(kept):])
	s.dispatched = kept
	return n, nil
}

// Find returns the envelope with id in any status.
func (s driverStore) Find(ctx context.Context, id uuid.UUID) (*driver.Envelope, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	e, ok := s.byID[id]
	if !ok {
		return nil, fmt.Errorf("%w: memstore: envelope %s", driver.ErrNotFound, id)
	}
	return e.env.Clone(), nil
}

// List returns envelopes with status, ordered by bucket then Seq, after the cursor.
func (s driverStore) List(ctx context.Context, status driver.Status, after driver.Cursor, limit int) ([]*driver.Envelope, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if limit <= 0 {
		return nil, nil
	}
	var match []*driver.Envelope
	for _, e := range s.byID {
		env := e.env
		if env.Status != status {
			continue
		}
		if env.Bucket < after.Bucket || (env.Bucket == after.Bucket && env.Seq <= after.Seq) {
			continue
		}
		match = append(match, env)
	}
	slices.SortFunc(match, func(a, b *driver.Envelope) int {
		if a.Bucket != b.Bucket {
			return a.Bucket - b.Bucket
		}
		return compareInt64(a.Seq, b.Seq)
	})
	match = match[:min(limit, len(match))]
	out := make([]*driver.Envelope, len(match))
	for i, env := range match {
		out[i] = env.Clone()
	}
	return out, nil
}

func compareInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Requeue makes parked envelopes pending and due now, with Attempts reset.
func (s driverStore) Requeue(ctx context.Context, ids ...uuid.UUID) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		e, ok := s.byID[id]
		if !ok || e.env.Status != driver.Parked {
			continue
		}
		e.env.Status = driver.Pending
		e.env.Attempts = 0
		e.env.NextAttemptAt = time.Time{}
		s.parked--
		s.revived(e)
		n++
	}
	return n, nil
}

// Purge deletes envelopes whatever their status.
func (s driverStore) Purge(ctx context.Context, ids ...uuid.UUID) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if e, ok := s.byID[id]; ok {
			s.remove(e)
			n++
		}
	}
	return n, nil
}

// Stats counts the backlog exactly: PendingLimit is [math.MaxInt].
func (s driverStore) Stats(ctx context.Context) (driver.Backlog, error) {
	if err := s.lock(ctx); err != nil {
		return driver.Backlog{}, err
	}
	defer s.mu.Unlock()
	st := driver.Backlog{
		Pending:      make([]int, s.bucketCount),
		PendingLimit: math.MaxInt,
		Parked:       s.parked,
	}
	for i := range s.buckets {
		b := &s.buckets[i]
		b.trimHead()
		st.Pending[i] = len(b.queue) - b.dead
		if len(b.queue) > 0 {
			created := b.queue[0].env.CreatedAt
			if st.OldestPending.IsZero() || created.Before(st.OldestPending) {
				st.OldestPending = created
			}
		}
	}
	return st, nil
}

// ReadCoordination returns every lease and relay record.
func (s driverStore) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	if err := s.lock(ctx); err != nil {
		return driver.Coordination{}, err
	}
	defer s.mu.Unlock()
	var c driver.Coordination
	for _, l := range s.leases {
		if l.Bucket >= 0 && l.Bucket < s.bucketCount {
			c.Leases = append(c.Leases, l)
		}
	}
	slices.SortFunc(c.Leases, func(a, b driver.Lease) int { return a.Bucket - b.Bucket })
	c.Relays = s.sortedRelays()
	return c, nil
}

// ReadRelays implements [driver.Leaser].
func (s driverStore) ReadRelays(ctx context.Context) ([]driver.RelayRecord, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.sortedRelays(), nil
}

// sortedRelays returns the relay records by ID; the caller holds mu.
func (s *Store) sortedRelays() []driver.RelayRecord {
	out := make([]driver.RelayRecord, 0, len(s.relays))
	for _, r := range s.relays {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b driver.RelayRecord) int { return strings.Compare(a.ID, b.ID) })
	return out
}

var errNoRelayID = errors.New("memstore: relay id is empty")

// Heartbeat moves the relay's LastSeen forward to at, records its bucket count and
// instance, and clears StoppedAt.
func (s driverStore) Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int, instance driver.Instance) (bool, error) {
	if relay == "" {
		return false, errNoRelayID
	}
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	if r, ok := s.relays[relay]; ok && !r.LastSeen.Before(at) {
		return false, nil
	}
	s.relays[relay] = driver.RelayRecord{ID: relay, LastSeen: at.UTC(), BucketCount: bucketCount, Instance: instance}
	return true, nil
}

// StopRelay stamps the relay stopped at at, creating the record if needed.
func (s driverStore) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if relay == "" {
		return errNoRelayID
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	at = at.UTC()
	r, ok := s.relays[relay]
	if !ok {
		r = driver.RelayRecord{ID: relay}
	}
	if r.LastSeen.Before(at) {
		r.LastSeen = at
	}
	r.StoppedAt = at
	s.relays[relay] = r
	return nil
}

// DeleteRelay deletes the relay record if its LastSeen still equals lastSeen.
func (s driverStore) DeleteRelay(ctx context.Context, relay string, lastSeen time.Time) (bool, error) {
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	r, ok := s.relays[relay]
	if !ok || !r.LastSeen.Equal(lastSeen) {
		return false, nil
	}
	delete(s.relays, relay)
	return true, nil
}

// Claim takes bucket for owner if the lease is absent, free or expired at now.
func (s driverStore) Claim(ctx context.Context, bucketNo int, owner string, now, expiresAt time.Time) (bool, error) {
	if err := s.checkBucket(bucketNo); err != nil {
		return false, err
	}
	if owner == "" {
		return false, errNoRelayID
	}
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	if l, ok := s.leases[bucketNo]; ok && !l.Free(now) {
		return false, nil
	}
	s.leases[bucketNo] = driver.Lease{Bucket: bucketNo, Owner: owner, ExpiresAt: expiresAt.UTC()}
	return true, nil
}

// Renew extends held to expiresAt if the stored lease is still held, unchanged and
// not expired at now.
func (s driverStore) Renew(ctx context.Context, held driver.Lease, now, expiresAt time.Time) (bool, error) {
	if err := s.checkBucket(held.Bucket); err != nil {
		return false, err
	}
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	l, ok := s.leases[held.Bucket]
	if !ok || held.Owner == "" || l.Owner != held.Owner || !l.ExpiresAt.Equal(held.ExpiresAt) || !l.ExpiresAt.After(now) {
		return false, nil
	}
	l.ExpiresAt = expiresAt.UTC()
	s.leases[held.Bucket] = l
	return true, nil
}

// Release frees held if the stored lease still names its owner and expiry. The freed
// lease keeps its expiry as a record; with no owner, any relay may claim it.
func (s driverStore) Release(ctx context.Context, held driver.Lease) (bool, error) {
	if err := s.checkBucket(held.Bucket); err != nil {
		return false, err
	}
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	l, ok := s.leases[held.Bucket]
	if !ok || held.Owner == "" || l.Owner != held.Owner || !l.ExpiresAt.Equal(held.ExpiresAt) {
		return false, nil
	}
	l.Owner = ""
	s.leases[held.Bucket] = l
	return true, nil
}

// Check reports whether the store is open: a memory store needs no migration.
func (s driverStore) Check(ctx context.Context) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}
