package relay

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// deadRelayFactor: a relay record that has not been seen for this many lease
// durations is deleted.
const deadRelayFactor = 10

// resignRereads bounds how often a stopping relay re-reads the leases to check that
// none still names it.
const resignRereads = 5

// storeErr wraps a store error with what was being done, but returns a context error
// unwrapped.
func storeErr(ctx context.Context, err error, format string, args ...any) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return fmt.Errorf("relay: "+format+": %w", append(args, err)...)
}

func (d *Relay) params() planParams {
	return planParams{BucketCount: d.cfg.BucketCount, LeaseDuration: d.cfg.LeaseDuration, StopHold: d.cfg.LeaseRenewInterval}
}

// countMismatch: an active peer runs with another bucket count. The relay stops
// without stamping itself stopped, so its heartbeat, which carries its count, stays
// visible and stops its peers too.
type countMismatch struct{ error }

func (e countMismatch) Unwrap() error { return e.error }

// coordinate runs one coordination round: one consistent read, the plan, this relay's
// own lease writes (renew, hand back, claim) sent concurrently, then the heartbeat,
// and the removal of stale relay records by the first active relay.
//
// The heartbeat goes last and carries the round's start time, which is no later than
// any lease write of the round: a relay that dies at any point of a round leaves a
// heartbeat that lapses no later than its leases, so peers never keep lapsed buckets
// reserved for it. A relay that peers do not count yet (its first round, a sweep, or
// after a gap) writes it first instead, so that its own read counts it.
func (d *Relay) coordinate(ctx context.Context) (leasePlan, error) {
	d.coordMu.Lock()
	defer d.coordMu.Unlock()
	d.rounds.Add(1)
	d.round++
	self := d.cfg.RelayID
	start := d.now()

	beatFirst := d.lastBeat.IsZero() || start.Sub(d.lastBeat) >= d.cfg.LeaseDuration/2
	if beatFirst {
		if err := d.heartbeat(ctx, start); err != nil {
			return leasePlan{}, err
		}
	}
	view, err := d.store.ReadCoordination(ctx)
	if err != nil {
		return leasePlan{}, storeErr(ctx, err, "read leases")
	}
	plan := planRound(view, self, start, d.params())
	d.lastPlan, d.lastView = plan, view
	if m := plan.Mismatch; m != nil {
		// Stop, but leave a heartbeat with this relay's count first, so the peer
		// stops as well whichever of the two sorts first.
		if _, err := d.store.Heartbeat(ctx, self, start, d.cfg.BucketCount); err != nil {
			d.log.Warn("relay: could not record this relay's bucket count for its peers", "error", err)
		}
		return plan, countMismatch{fmt.Errorf("%w: relay: relay %q runs with %d buckets and this relay %q with %d buckets; every writer, store and relay must use one count",
			outbox.ErrMisconfigured, m.ID, m.BucketCount, self, d.cfg.BucketCount)}
	}

	// Forget what the view no longer shows as ours: a peer took it while we stalled,
	// or it lapsed. Only the plan's writes below grant publishing again.
	d.mu.Lock()
	for b, l := range d.leases {
		if !plan.owns(b) || !heldInView(view, l) {
			delete(d.leases, b)
		}
	}
	for b := range d.handing {
		if !slices.ContainsFunc(plan.Release, func(l driver.Lease) bool { return l.Bucket == b }) {
			delete(d.handing, b)
		}
	}
	d.mu.Unlock()
	for _, l := range plan.Hold {
		d.mu.Lock()
		delete(d.leases, l.Bucket)
		d.mu.Unlock()
		d.log.Warn("relay: not renewing a lease whose stored expiry is later than this host's clock allows (clock set back?); publishing nothing from it until the clock passes the expiry",
			"bucket", l.Bucket, "expires", l.ExpiresAt, "now", start)
	}

	var writes []func(context.Context) error
	for _, l := range plan.Renew {
		writes = append(writes, func(ctx context.Context) error { return d.renew(ctx, l) })
	}
	for _, l := range plan.Release {
		writes = append(writes, func(ctx context.Context) error { return d.handBack(ctx, l) })
	}
	for _, b := range plan.Claim {
		writes = append(writes, func(ctx context.Context) error { return d.claim(ctx, b) })
	}
	if err := d.concurrently(ctx, writes); err != nil {
		return plan, err
	}

	if !beatFirst {
		if err := d.heartbeat(ctx, start); err != nil {
			return plan, err
		}
	}
	return plan, d.removeStaleRelays(ctx, view, start)
}

// heartbeat writes the relay's heartbeat, dated at, with its bucket count. The caller
// holds coordMu.
func (d *Relay) heartbeat(ctx context.Context, at time.Time) error {
	beat, err := d.store.Heartbeat(ctx, d.cfg.RelayID, at, d.cfg.BucketCount)
	if err != nil {
		return storeErr(ctx, err, "heartbeat")
	}
	if beat {
		d.lastBeat = at
		return nil
	}
	d.refuse(ctx, "heartbeat")
	d.log.Warn("relay: heartbeat refused: the stored heartbeat is later than this host's clock (clock set back?); claiming nothing until the clock catches up")
	return nil
}

// concurrently runs the lease writes of a round, up to MaxConcurrency at once, and
// returns the first error.
func (d *Relay) concurrently(ctx context.Context, writes []func(context.Context) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		sem   = make(chan struct{}, d.cfg.MaxConcurrency)
	)
	for _, w := range writes {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := w(ctx); err != nil {
				once.Do(func() { first = err })
			}
		})
	}
	wg.Wait()
	return first
}

// renew extends a lease this relay keeps. The write reads the clock as it is sent: a
// round slowed past a lease's expiry must not revive that lease with a renewal dated
// at the round's start.
func (d *Relay) renew(ctx context.Context, l driver.Lease) error {
	at := d.now()
	exp := at.Add(d.cfg.LeaseDuration)
	ok, err := d.store.Renew(ctx, l, at, exp)
	if err != nil {
		return storeErr(ctx, err, "renew bucket %d", l.Bucket)
	}
	d.mu.Lock()
	if ok {
		d.leases[l.Bucket] = driver.Lease{Bucket: l.Bucket, Owner: l.Owner, ExpiresAt: exp}
	} else {
		delete(d.leases, l.Bucket)
		delete(d.handing, l.Bucket)
	}
	d.mu.Unlock()
	if !ok {
		d.refuse(ctx, "renew")
		d.log.Warn("relay: lease renewal refused; the bucket moved to a peer", "bucket", l.Bucket)
	}
	return nil
}

// handBack releases a lease above this relay's share. A bucket whose drain is in
// flight is not waited for: it publishes nothing new, is renewed meanwhile, and is
// released by a round soon after the drain ends, so a slow publish never delays the
// round's other writes.
func (d *Relay) handBack(ctx context.Context, l driver.Lease) error {
	select {
	case d.bucketLocks[l.Bucket] <- struct{}{}:
	default:
		d.mu.Lock()
		d.handing[l.Bucket] = true
		d.mu.Unlock()
		return d.renew(ctx, l)
	}
	defer d.unlockBucket(l.Bucket)
	d.mu.Lock()
	delete(d.leases, l.Bucket)
	delete(d.handing, l.Bucket)
	d.mu.Unlock()
	ok, err := d.store.Release(ctx, l)
	if err != nil {
		return storeErr(ctx, err, "release bucket %d", l.Bucket)
	}
	if !ok {
		d.refuse(ctx, "release")
	}
	d.log.Debug("relay: handed back a bucket above fair share", "bucket", l.Bucket)
	return nil
}

// claim takes a free bucket the plan gives this relay, with a whole lease from the
// moment the write is sent.
func (d *Relay) claim(ctx context.Context, b int) error {
	at := d.now()
	exp := at.Add(d.cfg.LeaseDuration)
	ok, err := d.store.Claim(ctx, b, d.cfg.RelayID, at, exp)
	if err != nil {
		return storeErr(ctx, err, "claim bucket %d", b)
	}
	if !ok {
		d.refuse(ctx, "claim")
		d.log.Info("relay: claim refused; a peer took the bucket first", "bucket", b)
		return nil
	}
	d.mu.Lock()
	d.leases[b] = driver.Lease{Bucket: b, Owner: d.cfg.RelayID, ExpiresAt: exp}
	d.mu.Unlock()
	return nil
}

// heldInView reports whether view still shows l as this relay's lease with the same
// expiry.
func heldInView(view driver.Coordination, l driver.Lease) bool {
	i, ok := slices.BinarySearchFunc(view.Leases, l.Bucket, func(x driver.Lease, b int) int { return x.Bucket - b })
	return ok && view.Leases[i].Owner == l.Owner && view.Leases[i].ExpiresAt.Equal(l.ExpiresAt)
}

// removeStaleRelays deletes relay records stopped more than one LeaseDuration ago,
// and records unseen for ten. Only the active relay with the smallest ID does it, so
// peers do not race for the same conditional deletes.
func (d *Relay) removeStaleRelays(ctx context.Context, view driver.Coordination, now time.Time) error {
	self := d.cfg.RelayID
	for _, r := range view.Relays {
		if !r.Stopped() && now.Sub(r.LastSeen) < d.cfg.LeaseDuration {
			if r.ID != self {
				return nil // a live peer sorts first: it cleans up
			}
			break
		}
	}
	for _, r := range view.Relays {
		if r.ID == self {
			continue
		}
		stale := (r.Stopped() && now.Sub(r.StoppedAt) >= d.cfg.LeaseDuration) ||
			now.Sub(r.LastSeen) >= deadRelayFactor*d.cfg.LeaseDuration
		if !stale {
			continue
		}
		ok, err := d.store.DeleteRelay(ctx, r.ID, r.LastSeen)
		if err != nil {
			return storeErr(ctx, err, "delete relay record %q", r.ID)
		}
		if !ok {
			d.refuse(ctx, "delete_relay")
		}
	}
	return nil
}

// resign ends this relay's membership. It stops publishing and waits out any batch
// still in flight first, so that no publish overlaps a peer's claim; then it stamps
// the relay stopped (so a release cut short leaves leases that lapse, never buckets
// peers keep reserved for it), releases every lease naming it at once, guarded by
// owner, and reads again until none does. Peers claim nothing while a freshly stopped
// relay still holds a lease, so the few writes between the stamp and the last release
// are all they wait for.
func (d *Relay) resign(ctx context.Context) error {
	d.coordMu.Lock()
	defer d.coordMu.Unlock()
	self := d.cfg.RelayID
	d.mu.Lock()
	clear(d.leases)
	clear(d.handing)
	d.mu.Unlock()
	for b := range d.bucketLocks {
		if err := d.lockBucket(ctx, b); err != nil {
			return err
		}
		d.unlockBucket(b)
	}
	if err := d.store.StopRelay(ctx, self, d.now()); err != nil {
		return storeErr(ctx, err, "stamp relay stopped")
	}
	d.lastBeat = time.Time{} // a later sweep beats first, to be counted again
	for range resignRereads {
		view, err := d.store.ReadCoordination(ctx)
		if err != nil {
			return storeErr(ctx, err, "read leases")
		}
		var releases []func(context.Context) error
		for _, l := range view.Leases {
			if l.Owner != self {
				continue
			}
			releases = append(releases, func(ctx context.Context) error {
				ok, err := d.store.Release(ctx, l)
				if err != nil {
					return storeErr(ctx, err, "release bucket %d", l.Bucket)
				}
				if !ok {
					d.refuse(ctx, "release")
				}
				return nil
			})
		}
		if len(releases) == 0 {
			return nil
		}
		if err := d.concurrently(ctx, releases); err != nil {
			return err
		}
	}
	return fmt.Errorf("relay: leases still name relay %q after %d releases; they will lapse", self, resignRereads)
}
