package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/lifecycle"
)

// Relay relays envelopes from a store to a transport. Build one with [New], then
// either run the worker ([Relay.Start], [Relay.Stop]) or call
// [Relay.RunOnce] from a scheduler, and [Relay.DispatchOne] from a change
// stream.
//
// Inside, a relay is a few services that share one lease table: the coordinator
// (rounds and the pure planner), the drainer (select due, publish in waves, settle),
// and the backlog and retention samplers; the worker runs the coordinator and the
// drainer side by side on one lifecycle.
type Relay struct {
	cfg    Config
	log    *slog.Logger
	finder driver.Finder // nil: DispatchOne is refused

	leases    *leaseTable
	meter     *meter
	coord     *coordinator
	drain     *drainer
	backlog   *backlogSampler
	retention *retention
	stream    *streamer // nil: the store has no stream

	worker *lifecycle.Service
	// sweepMu serialises RunOnce calls.
	sweepMu sync.Mutex
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
	// InstanceClashes counts heartbeats of another live process seen in this relay's
	// own record: two processes run under one RelayID, and both publish the same
	// buckets. Each is also logged at ERROR (at most once per LeaseRenewInterval) with
	// both instances; give each process its own RelayID. A healthy fleet sees none.
	InstanceClashes int64
	// OutOfOrder counts envelopes a transport acknowledged although an earlier
	// envelope of their key failed in the same Publish call; it can only be non-zero
	// with a transport that claims to keep key order ([driver.KeyOrderKeeper]) and
	// does not.
	OutOfOrder int64
	// Diverted counts envelopes the stream's reader moved to the store's table (the
	// table lane; see Config.StreamRetryBudget).
	Diverted int64
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
	if c, ok := store.(driver.RelayIDChecker); ok {
		if err := c.CheckRelayID(cfg.RelayID); err != nil {
			return nil, fmt.Errorf("%w: relay.Config.RelayID (%d bytes) cannot be recorded by the store: %w", outbox.ErrMisconfigured, len(cfg.RelayID), err)
		}
	}
	if t, ok := transport.(driver.PublishTimeouter); ok {
		// A publish may start with as little as LeaseDuration − LeaseRenewInterval left
		// on its lease (just before a renewal); one that needs longer is abandoned.
		if limit, pt := cfg.LeaseDuration-cfg.LeaseRenewInterval, t.PublishTimeout(); pt >= limit {
			return nil, fmt.Errorf("%w: the transport waits up to %s for the broker (its publish timeout), which cannot finish inside a lease: relay.Config.LeaseDuration (%s) − LeaseRenewInterval (%s) must exceed it; lengthen the lease or shorten the transport's timeout",
				outbox.ErrMisconfigured, pt, cfg.LeaseDuration, cfg.LeaseRenewInterval)
		}
	}
	d, err := assemble(store, transport, cfg)
	if err != nil {
		return nil, err
	}
	if _, ok := transport.(driver.Pinger); !ok {
		d.log.Warn("relay: the transport cannot be pinged, so broker-loss failover is off: a relay cut off from its broker keeps its buckets; implement driver.Pinger (a transport wrapper forwards its inner transport's Ping)",
			"transport", fmt.Sprintf("%T", transport))
	}
	return d, nil
}

// assemble builds the relay's services over one lease table, meter and broker health,
// giving every store call a deadline (deadline.go).
func assemble(store driver.Store, transport driver.Transport, cfg Config) (*Relay, error) {
	bounded := deadlined{store, cfg.StoreTimeout}
	d := &Relay{
		cfg:    cfg,
		log:    cfg.Logger.With("relay", cfg.RelayID),
		leases: newLeaseTable(cfg.BucketCount, cfg.margin()),
		meter:  newMeter(cfg.Observer),
		worker: lifecycle.New(),
	}
	c := &d.cfg // every service reads the one config
	health := &brokerHealth{cache: c.settleInterval(), timeout: c.LeaseRenewInterval}
	health.pinger, _ = transport.(driver.Pinger)
	if f, ok := store.(driver.Finder); ok {
		d.finder = deadlinedFinder{bounded, f}
	}
	var retainer driver.Retainer
	if r, ok := store.(driver.Retainer); ok {
		retainer = deadlinedRetainer{bounded, r}
	}
	if cfg.Retention > 0 && retainer == nil {
		return nil, fmt.Errorf("%w: relay.Config.Retention is %s but the store does not implement driver.Retainer; set Retention to 0",
			outbox.ErrMisconfigured, cfg.Retention)
	}
	self, err := newInstance()
	if err != nil {
		return nil, err
	}
	d.coord = &coordinator{cfg: c, log: d.log, store: bounded, leases: d.leases, meter: d.meter, health: health,
		clash: &clashWatch{self: self}}
	if m, ok := store.(driver.Metered); ok {
		d.coord.metered = m.Metered()
	}
	d.drain = &drainer{cfg: c, log: d.log, store: bounded, transport: transport, retainer: retainer,
		leases: d.leases, meter: d.meter, health: health, failLog: make([]warnLimit, cfg.BucketCount)}
	d.drain.notifier, _ = store.(driver.Notifier)
	if p, ok := store.(driver.Prober); ok {
		d.drain.prober = deadlinedProber{bounded, p}
	}
	if k, ok := transport.(driver.KeyOrderKeeper); ok {
		d.drain.sameKeyBatches = k.KeepsKeyOrder()
	}
	// The sampler bounds each call itself.
	d.backlog = &backlogSampler{cfg: c, log: d.log, source: newBacklogSource(store), leases: d.leases, meter: d.meter}
	d.retention = &retention{cfg: c, retainer: retainer, leases: d.leases, meter: d.meter}
	stream, err := newStreamer(store, bounded, transport, c, d.log, d.meter)
	if err != nil {
		return nil, err
	}
	d.stream = stream
	return d, nil
}

// RelayID is the ID this relay uses in leases and heartbeats.
func (d *Relay) RelayID() string { return d.cfg.RelayID }

// Instance is this relay's process identity, written with every heartbeat: the host,
// the process ID and a random nonce drawn by [New]. Peers and tools
// (outboxctl leases) see it in the relay's record.
func (d *Relay) Instance() driver.Instance { return d.coord.clash.self }

// Stats returns the relay's counters.
func (d *Relay) Stats() Stats {
	st := d.meter.stats()
	st.Backlog, st.BacklogAt = d.backlog.last()
	if d.stream != nil {
		st.Diverted = d.stream.diverted.Load()
	}
	return st
}

// Owned returns, in order, the buckets this relay may publish from now: it holds
// their lease and the lease is not near its expiry.
func (d *Relay) Owned() []int {
	return d.leases.owned(d.cfg.now())
}

// Ready reports whether the worker is running and in a valid plan: its last
// coordination round succeeded less than LeaseDuration ago, found no bucket count
// mismatch, and the relay either holds its whole fair share or is a standby (the
// fleet has more relays than buckets). A relay that just started, is still taking
// over buckets from its peers, cannot reach the store, or has stopped is not ready;
// nor is a relay whose publishes have failed for longer than a LeaseRenewInterval
// while its broker does not answer a ping (a transport that implements
// [driver.Pinger]). It suits a readiness probe and never blocks.
func (d *Relay) Ready() bool {
	return d.worker.Running() && !d.coord.health.unreachable() && d.coord.ready(len(d.Owned()))
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
	if d.worker.Running() {
		return Result{}, fmt.Errorf("%w; RunOnce cannot run alongside it: use one or the other", ErrRunning)
	}
	// Overlapping sweeps would release each other's leases mid-drain.
	d.sweepMu.Lock()
	defer d.sweepMu.Unlock()
	var res Result
	d.coord.clash.started(d.cfg.now())
	if _, err := d.coord.coordinate(ctx); err != nil {
		// Hand back whatever the round took before it failed.
		if rerr := d.coord.resignBounded(ctx); rerr != nil {
			d.log.Warn("relay: releasing leases after a failed round failed; they lapse after LeaseDuration", "error", rerr)
		}
		return res, err
	}
	owned := d.Owned()
	res.Buckets = len(owned)
	drained, _, err := d.drain.buckets(ctx, owned, true)
	res.add(drained)
	if err == nil {
		var n int
		n, err = d.retention.cleanup(ctx)
		res.Deleted = n
	}
	if rerr := d.coord.resignBounded(ctx); rerr != nil {
		if err == nil {
			err = rerr
		} else {
			d.log.Warn("relay: releasing leases after a failed sweep failed; they lapse after LeaseDuration", "error", rerr)
		}
	}
	return res, err
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
	if err := checkEnvelope(env, d.cfg.BucketCount); err != nil {
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
	if !d.leases.publishable(b, d.cfg.now()) {
		if d.worker.Running() {
			return res, nil // the worker's plan gives the bucket to someone: they publish it
		}
		claimed, err := d.coord.claimOne(ctx, b)
		if err != nil || !claimed {
			return res, err
		}
		defer func() {
			// Release even if ctx ended, but never wait on the store for long.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.releaseBound())
			defer cancel()
			if err := d.coord.releaseOne(rctx, b); err != nil {
				d.log.Warn("relay: releasing a bucket claimed for one dispatch failed; its lease will lapse", "bucket", b, "error", err)
			}
		}()
	}
	res.Buckets = 1
	if err := d.leases.lock(ctx, b); err != nil {
		return res, err
	}
	defer d.leases.unlock(b)
	for {
		p, err := d.drain.once(ctx, b, seq)
		res.add(p.Result)
		if err != nil || !p.more || p.reached {
			return res, err
		}
	}
}
