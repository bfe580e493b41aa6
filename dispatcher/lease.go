package dispatcher

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/outboxkit/outbox"
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
	return fmt.Errorf("dispatcher: "+format+": %w", append(args, err)...)
}

func (d *Dispatcher) params() planParams {
	return planParams{BucketCount: d.cfg.BucketCount, LeaseDuration: d.cfg.LeaseDuration}
}

// coordinate runs one coordination round: heartbeat, one consistent read, the plan,
// then this relay's own writes (renew, hand back, claim), and the removal of stale
// relay records by the first active relay.
func (d *Dispatcher) coordinate(ctx context.Context) error {
	d.coordMu.Lock()
	defer d.coordMu.Unlock()
	d.rounds.Add(1)
	d.round++
	self := d.cfg.RelayID
	now := d.now()

	beat, err := d.store.Heartbeat(ctx, self, now)
	if err != nil {
		return storeErr(ctx, err, "heartbeat")
	}
	if !beat {
		d.refused.Add(1)
		d.log.Warn("dispatcher: heartbeat refused: the stored heartbeat is later than this host's clock (clock set back?); claiming nothing until the clock catches up")
	}
	view, err := d.store.ReadCoordination(ctx)
	if err != nil {
		return storeErr(ctx, err, "read leases")
	}
	plan := planRound(view, self, now, d.params())
	d.lastPlan = plan

	// Forget what the view no longer shows as ours: a peer took it while we stalled,
	// or it lapsed. Only the plan's writes below grant publishing again.
	d.mu.Lock()
	for b, l := range d.leases {
		if !plan.owns(b) || !heldInView(view, l) {
			delete(d.leases, b)
		}
	}
	d.mu.Unlock()

	// Each conditional write reads the clock as it is sent: a round slowed past a
	// lease's expiry must not revive that lease with a renewal dated at the round's
	// start, and a late claim gets a whole lease.
	for _, l := range plan.Renew {
		at := d.now()
		exp := at.Add(d.cfg.LeaseDuration)
		ok, err := d.store.Renew(ctx, l, at, exp)
		if err != nil {
			return storeErr(ctx, err, "renew bucket %d", l.Bucket)
		}
		d.mu.Lock()
		if ok {
			d.leases[l.Bucket] = outbox.Lease{Bucket: l.Bucket, Owner: self, ExpiresAt: exp}
		} else {
			delete(d.leases, l.Bucket)
		}
		d.mu.Unlock()
		if !ok {
			d.refused.Add(1)
			d.log.Warn("dispatcher: lease renewal refused; the bucket moved to a peer", "bucket", l.Bucket)
		}
	}
	for _, l := range plan.Hold {
		d.mu.Lock()
		delete(d.leases, l.Bucket)
		d.mu.Unlock()
		d.log.Warn("dispatcher: not renewing a lease whose stored expiry is later than this host's clock allows (clock set back?); publishing nothing from it until the clock passes the expiry",
			"bucket", l.Bucket, "expires", l.ExpiresAt, "now", now)
	}
	for _, l := range plan.Release {
		if err := d.lockBucket(ctx, l.Bucket); err != nil {
			return err
		}
		d.mu.Lock()
		delete(d.leases, l.Bucket)
		d.mu.Unlock()
		ok, err := d.store.Release(ctx, l)
		d.unlockBucket(l.Bucket)
		if err != nil {
			return storeErr(ctx, err, "release bucket %d", l.Bucket)
		}
		if !ok {
			d.refused.Add(1)
		}
		d.log.Debug("dispatcher: handed back a bucket above fair share", "bucket", l.Bucket)
	}
	// A heartbeat refused only because this round shares its microsecond with the
	// last one is harmless; a clock behind the stored heartbeat claims nothing (the
	// plan is empty then).
	if beat || !plan.ClockBehind {
		for _, b := range plan.Claim {
			at := d.now()
			exp := at.Add(d.cfg.LeaseDuration)
			ok, err := d.store.Claim(ctx, b, self, at, exp)
			if err != nil {
				return storeErr(ctx, err, "claim bucket %d", b)
			}
			if !ok {
				d.refused.Add(1)
				d.log.Info("dispatcher: claim refused; a peer took the bucket first", "bucket", b)
				continue
			}
			d.mu.Lock()
			d.leases[b] = outbox.Lease{Bucket: b, Owner: self, ExpiresAt: exp}
			d.mu.Unlock()
		}
	}
	return d.removeStaleRelays(ctx, view, now)
}

// heldInView reports whether view still shows l as this relay's lease with the same
// expiry.
func heldInView(view outbox.Coordination, l outbox.Lease) bool {
	i, ok := slices.BinarySearchFunc(view.Leases, l.Bucket, func(x outbox.Lease, b int) int { return x.Bucket - b })
	return ok && view.Leases[i].Owner == l.Owner && view.Leases[i].ExpiresAt.Equal(l.ExpiresAt)
}

// removeStaleRelays deletes relay records stopped more than one LeaseDuration ago,
// and records unseen for ten. Only the active relay with the smallest ID does it, so
// peers do not race for the same conditional deletes.
func (d *Dispatcher) removeStaleRelays(ctx context.Context, view outbox.Coordination, now time.Time) error {
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
			d.refused.Add(1)
		}
	}
	return nil
}

// resign ends this relay's membership: it stamps the relay stopped first (so a
// release cut short leaves leases that lapse, never buckets peers keep reserved for
// it), then releases every lease naming it, guarded by owner, and reads again until
// none does.
func (d *Dispatcher) resign(ctx context.Context) error {
	d.coordMu.Lock()
	defer d.coordMu.Unlock()
	self := d.cfg.RelayID
	if err := d.store.StopRelay(ctx, self, d.now()); err != nil {
		return storeErr(ctx, err, "stamp relay stopped")
	}
	// Stop publishing, then wait out any batch still in flight (a DispatchOne), so no
	// publish overlaps a peer's claim.
	d.mu.Lock()
	clear(d.leases)
	d.mu.Unlock()
	for b := range d.bucketLocks {
		if err := d.lockBucket(ctx, b); err != nil {
			return err
		}
		d.unlockBucket(b)
	}
	for range resignRereads {
		view, err := d.store.ReadCoordination(ctx)
		if err != nil {
			return storeErr(ctx, err, "read leases")
		}
		mine := 0
		for _, l := range view.Leases {
			if l.Owner != self {
				continue
			}
			mine++
			ok, err := d.store.Release(ctx, l)
			if err != nil {
				return storeErr(ctx, err, "release bucket %d", l.Bucket)
			}
			if !ok {
				d.refused.Add(1)
			}
		}
		if mine == 0 {
			return nil
		}
	}
	return fmt.Errorf("dispatcher: leases still name relay %q after %d releases; they will lapse", self, resignRereads)
}
