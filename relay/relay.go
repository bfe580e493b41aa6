package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Relay relays envelopes from a store to a transport. Build one with [New], then
// either run the worker ([Relay.Start], [Relay.Stop]) or call
// [Relay.RunOnce] from a scheduler, and [Relay.DispatchOne] from a change
// stream.
type Relay struct {
	store     driver.Store
	transport driver.Transport
	cfg       Config
	log       *slog.Logger
	notifier  driver.Notifier
	finder    driver.Finder
	retainer  driver.Retainer
	// sameKeyBatches: the transport keeps key order (driver.KeyOrderKeeper), so one
	// Publish call may carry several envelopes of a key.
	sameKeyBatches bool
	prober         driver.Prober

	// mu guards leases: the buckets this relay may publish, with the lease as stored.
	mu     sync.Mutex
	leases map[int]driver.Lease
	// bucketLocks serialise draining one bucket (worker, RunOnce, DispatchOne) and
	// releasing its lease.
	bucketLocks []chan struct{}
	// sweepMu serialises RunOnce calls.
	sweepMu sync.Mutex
	// coordMu serialises coordination rounds.
	coordMu sync.Mutex
	// handing holds the buckets this relay hands back once their drain in flight
	// ends; it publishes nothing new from them. Guarded by mu.
	handing map[int]bool
	// lastPlan and lastView are the last round's plan and view; round counts rounds
	// for standby skipping. Guarded by coordMu.
	lastPlan leasePlan
	lastView driver.Coordination
	round    uint64
	// lastBeat is the time of the relay's last accepted heartbeat; zero before the
	// first and after a resignation. Guarded by coordMu.
	lastBeat time.Time

	rounds, refused, published, retried, parked, deleted, outOfOrder atomic.Int64

	// obs is Config.Observer (nil: none); backlog samples the backlog (nil: the
	// store cannot). lastRoundOK is when the worker's last round succeeded, guarded
	// by coordMu; backlogMu guards backlogState.
	obs          Observer
	backlog      backlogSource
	lastRoundOK  time.Time
	backlogMu    sync.Mutex
	backlogState backlogState
	// sampling runs at most one backlog sample at a time (sampleBusy); the worker
	// waits for it before it stops.
	sampling   sync.WaitGroup
	sampleBusy atomic.Bool

	// health tracks whether the broker answers (transports that implement
	// driver.Pinger).
	health brokerHealth

	// failLogMu guards failLog, the per-bucket rate limit of publish-failure warnings.
	failLogMu sync.Mutex
	failLog   []failLogState

	life     sync.Mutex
	started  bool
	killed   bool
	stopReq  chan struct{}
	stopOnce sync.Once
	stopped  chan struct{}
	// cancelWork ends the worker's rounds and drains; kill ends the final release too.
	cancelWork, kill context.CancelFunc
	err              error
	// finishMu serialises the final resignation; resigned records it happened.
	finishMu sync.Mutex
	resigned atomic.Bool
}

// Stats are counters since the relay was built.
type Stats struct {
	// Rounds is the number of coordination rounds run.
	Rounds int64
	// RefusedWrites counts conditional lease and heartbeat writes the store refused.
	// A healthy fleet in steady state refuses none.
	RefusedWrites int64
	// Published counts envelopes the broker acknowledged.
	Published int64
	// Retried counts failed envelopes rescheduled with backoff.
	Retried int64
	// Parked counts envelopes parked.
	Parked int64
	// Deleted counts dispatched envelopes deleted by retention cleanup.
	Deleted int64
	// OutOfOrder counts envelopes a transport acknowledged although an earlier
	// envelope of their key failed in the same Publish call; it can only be non-zero
	// with a transport that claims to keep key order ([driver.KeyOrderKeeper]) and
	// does not.
	OutOfOrder int64
	// Backlog is the last backlog sample this relay took (it samples while it holds
	// bucket 0, every Config.BacklogInterval), and BacklogAt when it took it; both
	// zero before the first sample. Pending counts are capped per bucket as the
	// store's driver.Backlog says.
	Backlog   driver.Backlog
	BacklogAt time.Time
}

// Result sums up one [Relay.RunOnce] or [Relay.DispatchOne].
type Result struct {
	// Buckets is the number of buckets this call held and drained.
	Buckets int
	// Published counts envelopes the broker acknowledged.
	Published int
	// Retried counts failed envelopes rescheduled with backoff.
	Retried int
	// Parked counts envelopes parked.
	Parked int
	// Deleted counts dispatched envelopes removed by retention cleanup.
	Deleted int
}

func (r *Result) add(o Result) {
	r.Published += o.Published
	r.Retried += o.Retried
	r.Parked += o.Parked
	r.Deleted += o.Deleted
}

// New builds a relay over store and transport. It reads nothing and starts
// nothing. It takes its bucket count from the store (a non-zero Config.BucketCount
// must equal it), and Retention needs a store that implements [driver.Retainer];
// otherwise, and for any setting [Config.Validate] refuses, New returns an error
// wrapping [outbox.ErrMisconfigured].
func New(handle driver.Handle, transport driver.Transport, cfg Config) (*Relay, error) {
	if handle == nil {
		return nil, fmt.Errorf("%w: relay: store is nil", outbox.ErrMisconfigured)
	}
	store := handle.Driver()
	if store == nil {
		return nil, fmt.Errorf("%w: relay: the store's Driver is nil", outbox.ErrMisconfigured)
	}
	if transport == nil {
		return nil, fmt.Errorf("%w: relay: transport is nil", outbox.ErrMisconfigured)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := store.BucketCount()
	switch {
	case n < 1:
		return nil, fmt.Errorf("%w: relay: the store reports %d buckets; a store needs at least 1", outbox.ErrMisconfigured, n)
	case cfg.BucketCount == 0:
		cfg.BucketCount = n
	case cfg.BucketCount != n:
		return nil, fmt.Errorf("%w: relay.Config.BucketCount is %d but the store has %d buckets; leave BucketCount 0 to take the store's count, or build the store with %d (every writer, store and relay must use one count)",
			outbox.ErrMisconfigured, cfg.BucketCount, n, cfg.BucketCount)
	}
	if cfg.RelayID == "" {
		id, err := defaultRelayID()
		if err != nil {
			return nil, err
		}
		cfg.RelayID = id
	}
	bounded := deadlined{store, cfg.LeaseRenewInterval}
	d := &Relay{
		store:       bounded,
		transport:   transport,
		cfg:         cfg,
		log:         cfg.Logger.With("relay", cfg.RelayID),
		leases:      make(map[int]driver.Lease),
		handing:     make(map[int]bool),
		bucketLocks: make([]chan struct{}, cfg.BucketCount),
		failLog:     make([]failLogState, cfg.BucketCount),
		stopReq:     make(chan struct{}),
		stopped:     make(chan struct{}),
	}
	for i := range d.bucketLocks {
		d.bucketLocks[i] = make(chan struct{}, 1)
	}
	d.notifier, _ = store.(driver.Notifier)
	d.obs = cfg.Observer
	d.backlog = newBacklogSource(store) // sampleBacklog bounds each call
	if f, ok := store.(driver.Finder); ok {
		d.finder = deadlinedFinder{bounded, f}
	}
	if r, ok := store.(driver.Retainer); ok {
		d.retainer = deadlinedRetainer{bounded, r}
	}
	d.health.pinger, _ = transport.(driver.Pinger)
	if d.health.pinger == nil {
		d.log.Warn("relay: the transport cannot be pinged, so broker-loss failover is off: a relay cut off from its broker keeps its buckets; implement driver.Pinger (a transport wrapper forwards its inner transport's Ping)",
			"transport", fmt.Sprintf("%T", transport))
	}
	d.health.cache, d.health.timeout = d.settleInterval(), cfg.LeaseRenewInterval
	if k, ok := transport.(driver.KeyOrderKeeper); ok {
		d.sameKeyBatches = k.KeepsKeyOrder()
	}
	if p, ok := store.(driver.Prober); ok {
		d.prober = deadlinedProber{bounded, p}
	}
	if cfg.Retention > 0 && d.retainer == nil {
		return nil, fmt.Errorf("%w: relay.Config.Retention is %s but the store does not implement driver.Retainer; set Retention to 0",
			outbox.ErrMisconfigured, cfg.Retention)
	}
	return d, nil
}

// RelayID is the ID this relay uses in leases and heartbeats.
func (d *Relay) RelayID() string { return d.cfg.RelayID }

// Stats returns the relay's counters.
func (d *Relay) Stats() Stats {
	backlog, at := d.lastBacklog()
	return Stats{
		Backlog:       backlog,
		BacklogAt:     at,
		Rounds:        d.rounds.Load(),
		RefusedWrites: d.refused.Load(),
		Published:     d.published.Load(),
		Retried:       d.retried.Load(),
		Parked:        d.parked.Load(),
		Deleted:       d.deleted.Load(),
		OutOfOrder:    d.outOfOrder.Load(),
	}
}

// Owned returns, in order, the buckets this relay may publish from now: it holds
// their lease and the lease is not near its expiry.
func (d *Relay) Owned() []int {
	return d.ownedAt(d.now())
}

func (d *Relay) ownedAt(now time.Time) []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int
	for b, l := range d.leases {
		if d.valid(l, now) && !d.handing[b] {
			out = append(out, b)
		}
	}
	slices.Sort(out)
	return out
}

// margin is how long before its expiry a lease stops covering publishes: a batch that
// starts later could still be in flight when a peer takes the bucket.
func (d *Relay) margin() time.Duration { return d.cfg.LeaseRenewInterval / 2 }

func (d *Relay) valid(l driver.Lease, now time.Time) bool {
	return now.Before(l.ExpiresAt.Add(-d.margin()))
}

// errLeaseRanOut: a publish was still in flight when its bucket's lease lapsed.
var errLeaseRanOut = errors.New("relay: publish outlasted the bucket's lease")

// leaseLeft reports whether bucket's lease covers a publish starting now, and how long
// the lease has left.
func (d *Relay) leaseLeft(bucket int, now time.Time) (time.Duration, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.leases[bucket]
	if !ok || !d.valid(l, now) || d.handing[bucket] {
		return 0, false
	}
	return l.ExpiresAt.Sub(now), true
}

// publishable reports whether bucket's lease covers a publish starting now.
func (d *Relay) publishable(bucket int, now time.Time) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.leases[bucket]
	return ok && d.valid(l, now) && !d.handing[bucket]
}

// now reads the clock, in UTC, truncated to the microsecond precision stores keep.
func (d *Relay) now() time.Time {
	return d.cfg.Now().UTC().Truncate(time.Microsecond)
}

func (d *Relay) lockBucket(ctx context.Context, b int) error {
	select {
	case d.bucketLocks[b] <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *Relay) unlockBucket(b int) { <-d.bucketLocks[b] }

// running reports whether the worker was started and has not stopped.
func (d *Relay) running() bool {
	d.life.Lock()
	started := d.started
	d.life.Unlock()
	if !started {
		return false
	}
	select {
	case <-d.stopped:
		return false
	default:
		return true
	}
}

// RunOnce runs one sweep, for a scheduled function: it writes the heartbeat and takes
// the buckets the fair-share plan gives it, drains every due envelope of those buckets,
// runs retention cleanup if it holds bucket 0, then stamps the relay stopped and
// releases its leases. It refuses to run while the worker runs (an error wrapping
// [ErrRunning]); overlapping calls run one after the other. Every relay of a fleet
// sharing a store must use its own RelayID.
//
// If ctx ends during the sweep, the drains stop, but the relay is still stamped
// stopped and its leases handed back, trying for at most min(LeaseDuration, 5 s)
// more; RunOnce then returns ctx's error.
//
// A sweep does not renew the leases it took: it drains for at most LeaseDuration less
// half a LeaseRenewInterval, then stops and returns what it did, without an error.
// What it left is due for the next sweep; schedule sweeps more often than that, or
// use the worker for a backlog that takes longer.
func (d *Relay) RunOnce(ctx context.Context) (Result, error) {
	if d.running() {
		return Result{}, fmt.Errorf("%w; RunOnce cannot run alongside it: use one or the other", ErrRunning)
	}
	// Overlapping sweeps would release each other's leases mid-drain.
	d.sweepMu.Lock()
	defer d.sweepMu.Unlock()
	var res Result
	if _, err := d.coordinate(ctx); err != nil {
		// Hand back whatever the round took before it failed.
		if rerr := d.resignBounded(ctx); rerr != nil {
			d.log.Warn("relay: releasing leases after a failed round failed; they lapse after LeaseDuration", "error", rerr)
		}
		return res, err
	}
	owned := d.Owned()
	res.Buckets = len(owned)
	drained, _, err := d.drainBuckets(ctx, owned, true)
	res.add(drained)
	if err == nil {
		var n int
		n, err = d.cleanupRetention(ctx)
		res.Deleted = n
	}
	if rerr := d.resignBounded(ctx); rerr != nil {
		if err == nil {
			err = rerr
		} else {
			d.log.Warn("relay: releasing leases after a failed sweep failed; they lapse after LeaseDuration", "error", rerr)
		}
	}
	return res, err
}

// resignBounded resigns the relay even if ctx has ended, trying for at most
// releaseBound, so a sweep cut short still hands its buckets back.
func (d *Relay) resignBounded(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.releaseBound())
	defer cancel()
	return d.resign(rctx)
}

// DispatchOne publishes the envelope with id, for a change-stream trigger. The store
// must implement [driver.Finder].
//
// To keep per-key order it never publishes the envelope alone: under the lease of the
// envelope's bucket it drains that bucket, in Seq order, up to and including the
// envelope. If this relay's worker holds the bucket, it drains under that lease. If the
// bucket is free, it claims it, drains, and releases it at once. If another relay holds
// the bucket, or this relay's worker runs and its plan leaves the bucket to a peer,
// DispatchOne does nothing and returns a zero Result: the holder publishes the
// envelope. An envelope that is gone (published and deleted), no longer pending
// (dispatched, parked) or not yet due is left alone as well: the trigger succeeds.
func (d *Relay) DispatchOne(ctx context.Context, id uuid.UUID) (Result, error) {
	var res Result
	if d.finder == nil {
		return res, fmt.Errorf("%w: relay: DispatchOne needs a store that implements driver.Finder", outbox.ErrMisconfigured)
	}
	env, err := d.finder.Find(ctx, id)
	if errors.Is(err, driver.ErrNotFound) {
		return res, nil // published and deleted already
	}
	if err != nil {
		return res, err
	}
	if env.Status != driver.Pending {
		return res, nil
	}
	if err := d.checkEnvelope(env); err != nil {
		return res, err
	}
	return d.DispatchAt(ctx, env.Bucket, env.Seq)
}

// DispatchAt publishes the envelope with Seq seq in bucket, for a change-stream
// trigger whose record names the bucket and the Seq (a DynamoDB stream record's keys
// do), so no lookup by ID is needed. It follows the rules of [Relay.DispatchOne]:
// under the bucket's lease it drains the bucket in Seq order up to and including seq;
// a bucket another relay holds, or that this relay's running worker leaves to a peer,
// is left alone with a zero Result; an envelope that is gone or not yet due is left
// alone as well. A bucket outside the relay's bucket count is an error wrapping
// [outbox.ErrMisconfigured].
func (d *Relay) DispatchAt(ctx context.Context, bucket int, seq int64) (Result, error) {
	var res Result
	if bucket < 0 || bucket >= d.cfg.BucketCount {
		return res, fmt.Errorf("%w: relay: DispatchAt: bucket %d is outside this relay's %d buckets; every writer, store and relay must use one count",
			outbox.ErrMisconfigured, bucket, d.cfg.BucketCount)
	}
	b := bucket
	if !d.publishable(b, d.now()) {
		if d.running() {
			return res, nil // the worker's plan gives the bucket to someone: they publish it
		}
		claimed, err := d.claimOne(ctx, b)
		if err != nil || !claimed {
			return res, err
		}
		defer func() {
			// Release even if ctx ended, but never wait on the store for long.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.releaseBound())
			defer cancel()
			if err := d.releaseOne(rctx, b); err != nil {
				d.log.Warn("relay: releasing a bucket claimed for one dispatch failed; its lease will lapse", "bucket", b, "error", err)
			}
		}()
	}
	res.Buckets = 1
	if err := d.lockBucket(ctx, b); err != nil {
		return res, err
	}
	defer d.unlockBucket(b)
	for {
		p, err := d.drainOnce(ctx, b, seq)
		res.add(p.Result)
		if err != nil || !p.more || p.reached {
			return res, err
		}
	}
}

// claimOne claims a free bucket outside the plan for one dispatch. It reads first, so
// a bucket another relay holds costs no refused write.
func (d *Relay) claimOne(ctx context.Context, b int) (bool, error) {
	view, err := d.store.ReadCoordination(ctx)
	if err != nil {
		return false, err
	}
	now := d.now()
	for _, l := range view.Leases {
		if l.Bucket == b && !l.Free(now) {
			return false, nil
		}
	}
	exp := now.Add(d.cfg.LeaseDuration)
	ok, err := d.store.Claim(ctx, b, d.cfg.RelayID, now, exp)
	if err != nil {
		return false, err
	}
	if !ok {
		d.refuse(ctx, "claim")
		return false, nil
	}
	d.mu.Lock()
	d.leases[b] = driver.Lease{Bucket: b, Owner: d.cfg.RelayID, ExpiresAt: exp}
	d.mu.Unlock()
	return true, nil
}

// releaseOne hands back one bucket's lease once no drain of it runs.
func (d *Relay) releaseOne(ctx context.Context, b int) error {
	if err := d.lockBucket(ctx, b); err != nil {
		return err
	}
	defer d.unlockBucket(b)
	d.mu.Lock()
	l, ok := d.leases[b]
	delete(d.leases, b)
	d.mu.Unlock()
	if !ok {
		return nil
	}
	released, err := d.store.Release(ctx, l)
	if err == nil && !released {
		d.refuse(ctx, "release")
	}
	return err
}

// checkEnvelope refuses an envelope written with another bucket count.
func (d *Relay) checkEnvelope(env *driver.Envelope) error {
	if env.Bucket < 0 || env.Bucket >= d.cfg.BucketCount {
		return fmt.Errorf("%w: envelope %s is in bucket %d, outside this relay's %d buckets; every writer, store and relay must use one count",
			outbox.ErrMisconfigured, env.ID, env.Bucket, d.cfg.BucketCount)
	}
	if env.BucketCount != 0 && env.BucketCount != d.cfg.BucketCount {
		return fmt.Errorf("%w: envelope %s in bucket %d was written with bucket count %d, but this relay uses %d; every writer, store and relay must use one count (drain the store before changing it)",
			outbox.ErrMisconfigured, env.ID, env.Bucket, env.BucketCount, d.cfg.BucketCount)
	}
	return nil
}

// drainBuckets drains buckets in parallel, up to MaxConcurrency at once. With
// untilEmpty it keeps draining each bucket while it has due envelopes; otherwise it
// drains one batch each and returns the buckets that may have more.
func (d *Relay) drainBuckets(ctx context.Context, buckets []int, untilEmpty bool) (Result, []int, error) {
	var (
		mu    sync.Mutex
		res   Result
		more  []int
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, d.cfg.MaxConcurrency)
	)
	for _, b := range buckets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			var local Result
			var err error
			hasMore := false
			if err = d.lockBucket(ctx, b); err == nil {
				for {
					var p pass
					p, err = d.drainOnce(ctx, b, -1)
					local.add(p.Result)
					hasMore = p.more
					if err != nil || !p.more || !untilEmpty {
						break
					}
				}
				d.unlockBucket(b)
			}
			mu.Lock()
			defer mu.Unlock()
			res.add(local)
			if hasMore && err == nil {
				more = append(more, b)
			}
			if err != nil && (first == nil || errors.Is(err, outbox.ErrMisconfigured)) {
				first = err
			}
		})
	}
	wg.Wait()
	slices.Sort(more)
	return res, more, first
}

// pass is the outcome of one batch of one bucket.
type pass struct {
	Result
	// more: the bucket may hold more due envelopes.
	more bool
	// reached: the envelope DispatchOne looks for was handled or is held back.
	reached bool
}

// drainOnce fetches one batch of bucket b and publishes what is due. With upTo >= 0 it
// stops at the envelope with that Seq. The caller holds the bucket's lock.
func (d *Relay) drainOnce(ctx context.Context, b int, upTo int64) (pass, error) {
	var p pass
	if !d.publishable(b, d.now()) {
		return p, nil
	}
	envs, err := d.store.Fetch(ctx, b, d.cfg.BatchSize)
	if err != nil {
		return p, err
	}
	now := d.now()
	if !d.publishable(b, now) {
		return p, nil
	}
	fetched := len(envs)
	if upTo >= 0 {
		// The target is handled in this window if the window reaches it, or if the
		// bucket ends before it (it is gone already).
		p.reached = fetched < d.cfg.BatchSize
		cut := fetched
		for i, e := range envs {
			if e.Seq >= upTo {
				p.reached = true
			}
			if e.Seq > upTo {
				cut = i
				break
			}
		}
		envs = envs[:cut]
	}
	for _, e := range envs {
		if err := d.checkEnvelope(e); err != nil {
			d.log.Error("relay: bucket count mismatch; the relay stops", "bucket", b, "error", err)
			return p, err
		}
	}

	// Due envelopes in Seq order; a key whose earlier envelope is not due (it failed
	// and waits for its retry) holds its later envelopes back.
	blocked := make(map[string]bool)
	var due []*driver.Envelope
	for _, e := range envs {
		keyed := e.Key != nil && !d.cfg.Unordered
		if keyed && blocked[string(e.Key)] {
			continue
		}
		if !e.Due(now) {
			if keyed {
				blocked[string(e.Key)] = true
			}
			continue
		}
		due = append(due, e)
	}

	// Publish in waves: the n-th due envelope of a key goes in wave n, so a call
	// carries at most one envelope per key and a failure can still hold back that
	// key's later envelopes. Keys that are all distinct (the usual case) make one wave.
	var waves [][]*driver.Envelope
	if d.cfg.Unordered || d.sameKeyBatches {
		waves = [][]*driver.Envelope{due}
	} else {
		seen := make(map[string]int)
		for _, e := range due {
			w := 0
			if e.Key != nil {
				w = seen[string(e.Key)]
				seen[string(e.Key)] = w + 1
			}
			if w == len(waves) {
				waves = append(waves, nil)
			}
			waves[w] = append(waves[w], e)
		}
	}
	// What the broker acknowledged in every wave is completed in one call at the end
	// of the pass (and before an early return), so waves cost no extra store write.
	var acked []*driver.Envelope
	completeAll := func() error {
		if err := d.complete(ctx, acked); err != nil {
			return err
		}
		p.Published += len(acked)
		acked = nil
		return nil
	}
	for i, wave := range waves {
		if i > 0 {
			// Drop envelopes whose key failed in an earlier wave.
			wave = slices.DeleteFunc(wave, func(e *driver.Envelope) bool { return blocked[string(e.Key)] })
		}
		if len(wave) == 0 {
			break
		}
		left, ok := d.leaseLeft(b, d.now())
		if !ok {
			return p, completeAll()
		}
		res, failedKeys, ackedWave, err := d.publish(ctx, wave, left)
		p.add(res)
		acked = append(acked, ackedWave...)
		if errors.Is(err, errLeaseRanOut) {
			d.log.Warn("relay: a publish outlasted the bucket's lease and was abandoned; its messages go out again", "bucket", b)
			return p, completeAll()
		}
		if err != nil {
			if ctx.Err() == nil {
				_ = completeAll() // what the broker took need not go out again
			}
			return p, err
		}
		if !d.cfg.Unordered {
			for k := range failedKeys {
				blocked[k] = true
			}
		}
	}
	if err := completeAll(); err != nil {
		return p, err
	}
	progressed := p.Published+p.Retried+p.Parked > 0
	p.more = fetched == d.cfg.BatchSize && progressed
	if upTo >= 0 {
		// A window held back entirely cannot reach the target: stop rather than spin.
		p.more = !p.reached && progressed
	}
	return p, nil
}

// publish sends one batch and records every outcome: one Complete (or MarkDispatched)
// for the acknowledged envelopes, a Reschedule or Park per key's first failed one. It
// returns the keys that failed.
//
// The publish may take at most leaseLeft: a peer can claim the bucket once the lease
// lapses, so a batch still in flight then is abandoned (errLeaseRanOut), with nothing
// assumed sent and no attempt charged.
func (d *Relay) publish(ctx context.Context, batch []*driver.Envelope, leaseLeft time.Duration) (Result, map[string]bool, []*driver.Envelope, error) {
	var res Result
	pctx, cancel := context.WithTimeout(ctx, leaseLeft)
	start := time.Now()
	err := d.transport.Publish(pctx, batch)
	took := time.Since(start)
	cancel()
	if err != nil && pctx.Err() != nil {
		if ctx.Err() != nil {
			// Shutting down: nothing is assumed sent and nothing counts as an attempt.
			d.observeAbandoned(ctx, batch, start, took, err)
			return res, nil, nil, ctx.Err()
		}
		if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			d.observeAbandoned(ctx, batch, start, took, err)
			d.health.published(d.now(), 0, true)
			return res, nil, nil, errLeaseRanOut
		}
	}
	failed := make(map[uuid.UUID]error)
	if err != nil {
		var pe *driver.PublishError
		if errors.As(err, &pe) {
			for _, f := range pe.Failed {
				failed[f.ID] = f.Err
			}
		} else {
			for _, e := range batch {
				failed[e.ID] = err
			}
		}
	}
	now := d.now()
	acked := make([]*driver.Envelope, 0, len(batch))
	failedKeys := make(map[string]bool)
	for _, e := range batch {
		if _, bad := failed[e.ID]; bad {
			if e.Key != nil {
				failedKeys[string(e.Key)] = true
			}
			continue
		}
		if e.Key != nil && failedKeys[string(e.Key)] && !d.cfg.Unordered {
			d.outOfOrder.Add(1)
			d.log.Warn("relay: the transport acknowledged a message after failing an earlier one of its key in the same batch; first deliveries of this key are out of order",
				"message_id", e.ID, "topic", e.Topic, "bucket", e.Bucket)
		}
		acked = append(acked, e)
	}
	if d.obs != nil {
		d.obs.Published(ctx, batch, acked, start, took, err)
	}
	permanentFailure := false
	for _, cause := range failed {
		permanentFailure = permanentFailure || driver.IsPermanent(cause)
	}
	d.health.published(now, len(acked), err != nil && !permanentFailure)
	// Only a key's first failure in the batch is an attempt. The key's later failed
	// envelopes were held back by it (or share its fate): they stay pending and due,
	// and the next fetch holds them behind it, at no cost in attempts or backoff.
	charged := make(map[string]bool)
	for _, e := range batch {
		cause, bad := failed[e.ID]
		if !bad {
			continue
		}
		if e.Key != nil && !d.cfg.Unordered {
			if charged[string(e.Key)] {
				continue
			}
			charged[string(e.Key)] = true
		}
		attempts := e.Attempts + 1
		msg := cause.Error()
		permanent := driver.IsPermanent(cause)
		// A relay cut off from its broker parks nothing: a peer may deliver it.
		if permanent || (attempts >= d.cfg.MaxAttempts && !d.health.cutOff(ctx, now, 0)) {
			if err := d.store.Park(ctx, e, msg); err != nil {
				return res, failedKeys, acked, err
			}
			res.Parked++
			d.parked.Add(1)
			if d.obs != nil {
				d.obs.Parked(ctx, e, permanent, msg)
			}
			d.log.Warn("relay: message parked; it waits for an operator to requeue or purge it",
				"message_id", e.ID, "topic", e.Topic, "bucket", e.Bucket, "attempts", attempts,
				"permanent", permanent, "error", msg)
			continue
		}
		next := now.Add(d.backoff(attempts))
		if err := d.store.Reschedule(ctx, e, next, msg); err != nil {
			return res, failedKeys, acked, err
		}
		res.Retried++
		d.retried.Add(1)
		if d.obs != nil {
			d.obs.Retried(ctx, e, attempts, msg)
		}
		d.logFailure(e, attempts, next, msg, now)
	}
	return res, failedKeys, acked, nil
}

// complete forgets what the broker acknowledged in a drain pass, in one call: deletes
// it, or marks it dispatched when retention is on. On failure the envelopes stay
// pending and go out again: duplicates, never a loss.
func (d *Relay) complete(ctx context.Context, acked []*driver.Envelope) error {
	if len(acked) == 0 {
		return nil
	}
	var err error
	if d.cfg.Retention > 0 {
		err = d.retainer.MarkDispatched(ctx, acked, d.now())
	} else {
		err = d.store.Complete(ctx, acked)
	}
	if err != nil {
		return err
	}
	d.published.Add(int64(len(acked)))
	if d.obs != nil {
		d.obs.Completed(ctx, acked)
	}
	return nil
}

// failLogState is one bucket's publish-failure warning rate limit.
type failLogState struct {
	last       time.Time // when the last warning was logged; zero: never
	suppressed int       // failures logged at DEBUG since then
}

// logFailure logs a failed publish that will be retried: at WARN for the first
// failure of a bucket in each LeaseRenewInterval, with the number of failures logged
// at DEBUG since the previous warning; at DEBUG otherwise.
func (d *Relay) logFailure(e *driver.Envelope, attempts int, next time.Time, cause string, now time.Time) {
	d.failLogMu.Lock()
	st := &d.failLog[e.Bucket]
	warn := st.last.IsZero() || now.Sub(st.last) >= d.cfg.LeaseRenewInterval || now.Before(st.last)
	suppressed := st.suppressed
	if warn {
		st.last, st.suppressed = now, 0
	} else {
		st.suppressed++
	}
	d.failLogMu.Unlock()
	attrs := []any{"message_id", e.ID, "topic", e.Topic, "bucket", e.Bucket, "attempts", attempts,
		"next_attempt", next, "error", cause}
	if warn {
		d.log.Warn("relay: publish failed; retrying later",
			append(attrs, "suppressed", suppressed)...)
		return
	}
	d.log.Debug("relay: publish failed; retrying later", attrs...)
}

// backoff is the delay after the given number of failed attempts: BackoffBase doubled
// per further failure, capped at BackoffMax, minus a random share of up to Jitter.
func (d *Relay) backoff(attempts int) time.Duration {
	delay := d.cfg.BackoffBase
	for i := 1; i < attempts && delay < d.cfg.BackoffMax; i++ {
		delay *= 2
	}
	delay = min(delay, d.cfg.BackoffMax)
	if d.cfg.Jitter > 0 {
		delay -= time.Duration(rand.Float64() * d.cfg.Jitter * float64(delay))
	}
	return delay
}

// cleanupRetention deletes dispatched envelopes older than Retention, in bounded
// batches, if this relay holds bucket 0 (so one relay of the fleet does it).
func (d *Relay) cleanupRetention(ctx context.Context) (int, error) {
	if d.cfg.Retention <= 0 || !d.publishable(0, d.now()) {
		return 0, nil
	}
	before := d.now().Add(-d.cfg.Retention)
	total := 0
	for range retentionRounds {
		n, err := d.retainer.DeleteDispatched(ctx, before, retentionBatch)
		total += n
		d.deleted.Add(int64(n))
		if d.obs != nil && n > 0 {
			d.obs.RetentionDeleted(ctx, n)
		}
		if err != nil {
			return total, err
		}
		if n < retentionBatch {
			break
		}
	}
	return total, nil
}
