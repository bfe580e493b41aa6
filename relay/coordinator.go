package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/lifecycle"
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

// coordinator runs the coordination rounds: it reads the fleet's leases and
// heartbeats, computes this relay's part with the pure planner (planRound) and carries
// it out, and hands everything back when the relay resigns.
type coordinator struct {
	cfg    *Config
	log    *slog.Logger
	store  driver.Store
	leases *leaseTable
	meter  *meter
	health *brokerHealth
	// metered reports that the store bills each request (driver.Metered).
	metered bool
	// clash holds this relay's instance and notices another one under its ID.
	clash *clashWatch

	// mu serialises rounds and resignations, and guards the rest.
	mu sync.Mutex
	// lastPlan and lastView are the last round's plan and view; round counts rounds
	// for standby skipping.
	lastPlan leasePlan
	lastView driver.Coordination
	round    uint64
	// lastBeat is the time of the relay's last accepted heartbeat; zero before the
	// first and after a resignation.
	lastBeat time.Time
	// lastOK is when the worker's last round succeeded, for Ready.
	lastOK time.Time
	// failedClaims counts the consecutive rounds in which a claim failed (an error,
	// not a refusal): see giveWay.
	failedClaims int
}

// giveWayAfter is how many rounds in a row with failed claims make a relay give way.
const giveWayAfter = 3

func (c *coordinator) params() planParams {
	return planParams{BucketCount: c.cfg.BucketCount, LeaseDuration: c.cfg.LeaseDuration, StopHold: c.cfg.LeaseRenewInterval}
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
func (c *coordinator) coordinate(ctx context.Context) (leasePlan, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.meter.rounds.Add(1)
	c.round++
	self := c.cfg.RelayID
	start := c.cfg.now()

	beatFirst := c.lastBeat.IsZero() || start.Sub(c.lastBeat) >= c.cfg.LeaseDuration/2
	if beatFirst {
		if err := c.heartbeat(ctx, start); err != nil {
			return leasePlan{}, err
		}
	}
	view, err := c.store.ReadCoordination(ctx)
	if err != nil {
		return leasePlan{}, storeErr(ctx, err, "read leases")
	}
	c.checkInstance(ctx, view.Relays, c.cfg.now())
	plan := planRound(view, self, start, c.params())
	c.lastPlan, c.lastView = plan, view
	if m := plan.Mismatch; m != nil {
		// Stop, but leave a heartbeat with this relay's count first, so the peer
		// stops as well whichever of the two sorts first.
		if _, err := c.store.Heartbeat(ctx, self, start, c.cfg.BucketCount, c.clash.self); err != nil {
			c.log.Warn("relay: could not record this relay's bucket count for its peers", "error", err)
		}
		return plan, countMismatch{fmt.Errorf("%w: relay: relay %q runs with %d buckets and this relay %q with %d buckets; every writer, store and relay must use one count",
			outbox.ErrMisconfigured, m.ID, m.BucketCount, self, c.cfg.BucketCount)}
	}

	// Forget what the view no longer shows as ours: a peer took it while we stalled,
	// or it lapsed. Only the plan's writes below grant publishing again.
	c.leases.keepOnly(
		func(l driver.Lease) bool { return plan.owns(l.Bucket) && heldInView(view, l) },
		func(b int) bool {
			return slices.ContainsFunc(plan.Release, func(l driver.Lease) bool { return l.Bucket == b })
		})
	for _, l := range plan.Hold {
		c.leases.take(l.Bucket)
		c.log.Warn("relay: not renewing a lease whose stored expiry is later than this host's clock allows (clock set back?); publishing nothing from it until the clock passes the expiry",
			"bucket", l.Bucket, "expires", l.ExpiresAt, "now", start)
	}

	var writes []func(context.Context) error
	for _, l := range plan.Renew {
		writes = append(writes, func(ctx context.Context) error { return c.renew(ctx, l) })
	}
	for _, l := range plan.Release {
		writes = append(writes, func(ctx context.Context) error { return c.handBack(ctx, l) })
	}
	var claimFailed atomic.Bool
	for _, b := range plan.Claim {
		writes = append(writes, func(ctx context.Context) error {
			err := c.claim(ctx, b)
			claimFailed.CompareAndSwap(false, err != nil)
			return err
		})
	}
	err = c.concurrently(ctx, writes)
	switch {
	case claimFailed.Load() && ctx.Err() == nil:
		c.failedClaims++
	case len(plan.Claim) > 0:
		c.failedClaims = 0
	}
	if err != nil {
		return plan, err
	}

	if !beatFirst {
		if err := c.heartbeat(ctx, start); err != nil {
			return plan, err
		}
	}
	return plan, c.removeStaleRelays(ctx, view, start)
}

// heartbeat writes the relay's heartbeat, dated at, with its bucket count. The caller
// holds coordMu.
func (c *coordinator) heartbeat(ctx context.Context, at time.Time) error {
	beat, err := c.store.Heartbeat(ctx, c.cfg.RelayID, at, c.cfg.BucketCount, c.clash.self)
	if err != nil {
		return storeErr(ctx, err, "heartbeat")
	}
	if beat {
		c.lastBeat = at
		return nil
	}
	c.meter.refuse(ctx, "heartbeat")
	c.log.Warn("relay: heartbeat refused: the stored heartbeat is later than this host's clock (clock set back, or another process running under this relay ID?); claiming nothing until the clock catches up")
	return nil
}

// concurrently runs the lease writes of a round, up to MaxConcurrency at once, and
// returns the first error.
func (c *coordinator) concurrently(ctx context.Context, writes []func(context.Context) error) error {
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		sem   = make(chan struct{}, c.cfg.MaxConcurrency)
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
func (c *coordinator) renew(ctx context.Context, l driver.Lease) error {
	at := c.cfg.now()
	exp := at.Add(c.cfg.LeaseDuration)
	ok, err := c.store.Renew(ctx, l, at, exp)
	if err != nil {
		return storeErr(ctx, err, "renew bucket %d", l.Bucket)
	}
	if ok {
		c.leases.set(driver.Lease{Bucket: l.Bucket, Owner: l.Owner, ExpiresAt: exp})
	} else {
		c.leases.forget(l.Bucket)
	}
	if !ok {
		c.meter.refuse(ctx, "renew")
		c.log.Warn("relay: lease renewal refused; the bucket moved to a peer", "bucket", l.Bucket)
	}
	return nil
}

// handBack releases a lease above this relay's share. A bucket whose drain is in
// flight is not waited for: it publishes nothing new, is renewed meanwhile, and is
// released by a round soon after the drain ends, so a slow publish never delays the
// round's other writes.
func (c *coordinator) handBack(ctx context.Context, l driver.Lease) error {
	if !c.leases.tryLock(l.Bucket) {
		c.leases.handOver(l.Bucket)
		return c.renew(ctx, l)
	}
	defer c.leases.unlock(l.Bucket)
	c.leases.forget(l.Bucket)
	ok, err := c.store.Release(ctx, l)
	if err != nil {
		return storeErr(ctx, err, "release bucket %d", l.Bucket)
	}
	if !ok {
		c.meter.refuse(ctx, "release")
	}
	c.log.Debug("relay: handed back a bucket above fair share", "bucket", l.Bucket)
	return nil
}

// claim takes a free bucket the plan gives this relay, with a whole lease from the
// moment the write is sent.
func (c *coordinator) claim(ctx context.Context, b int) error {
	at := c.cfg.now()
	exp := at.Add(c.cfg.LeaseDuration)
	ok, err := c.store.Claim(ctx, b, c.cfg.RelayID, at, exp)
	if err != nil {
		return storeErr(ctx, err, "claim bucket %d", b)
	}
	if !ok {
		c.meter.refuse(ctx, "claim")
		c.log.Info("relay: claim refused; a peer took the bucket first", "bucket", b)
		return nil
	}
	c.leases.set(driver.Lease{Bucket: b, Owner: c.cfg.RelayID, ExpiresAt: exp})
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
func (c *coordinator) removeStaleRelays(ctx context.Context, view driver.Coordination, now time.Time) error {
	self := c.cfg.RelayID
	for _, r := range view.Relays {
		if !r.Stopped() && now.Sub(r.LastSeen) < c.cfg.LeaseDuration {
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
		stale := (r.Stopped() && now.Sub(r.StoppedAt) >= c.cfg.LeaseDuration) ||
			now.Sub(r.LastSeen) >= deadRelayFactor*c.cfg.LeaseDuration
		if !stale {
			continue
		}
		ok, err := c.store.DeleteRelay(ctx, r.ID, r.LastSeen)
		if err != nil {
			return storeErr(ctx, err, "delete relay record %q", r.ID)
		}
		if !ok {
			c.meter.refuse(ctx, "delete_relay")
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
func (c *coordinator) resign(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	self := c.cfg.RelayID
	c.leases.clear()
	if err := c.leases.waitIdle(ctx); err != nil {
		return err
	}
	// A store call that fails (a slow store runs past StoreTimeout) is tried again
	// within the stop's own time: a graceful stop should not leave its leases to
	// lapse for one slow write while its context still has room.
	var failed error
	stamped := false
	for range resignRereads {
		if ctx.Err() != nil {
			break
		}
		if !stamped {
			if err := c.store.StopRelay(ctx, self, c.cfg.now()); err != nil {
				failed = storeErr(ctx, err, "stamp relay stopped")
				continue
			}
			stamped = true
			c.lastBeat = time.Time{} // a later sweep beats first, to be counted again
		}
		view, err := c.store.ReadCoordination(ctx)
		if err != nil {
			failed = storeErr(ctx, err, "read leases")
			continue
		}
		var releases []func(context.Context) error
		for _, l := range view.Leases {
			if l.Owner != self {
				continue
			}
			releases = append(releases, func(ctx context.Context) error {
				ok, err := c.store.Release(ctx, l)
				if err != nil {
					return storeErr(ctx, err, "release bucket %d", l.Bucket)
				}
				if !ok {
					c.meter.refuse(ctx, "release")
				}
				return nil
			})
		}
		if len(releases) == 0 {
			return nil
		}
		failed = c.concurrently(ctx, releases)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if failed != nil {
		return failed
	}
	return fmt.Errorf("relay: leases still name relay %q after %d releases; they will lapse", self, resignRereads)
}

// loop runs the coordination rounds on their own clock: every LeaseRenewInterval in
// steady state, at once when the watch read sees the membership change, every
// settleInterval while buckets move, and just after a peer's lease or heartbeat
// lapses. After each round it calls after and signals rounds. It returns nil when
// asked to stop, or the error that stops the worker for good.
func (c *coordinator) loop(r lifecycle.Run, rounds chan<- struct{}, after func(context.Context, leasePlan, error)) error {
	ctx := r.Work
	var errDelay, watchDelay time.Duration
	next := time.Now()
	for !r.Stopped() {
		if wait := time.Until(next); wait > 0 {
			if every := c.watchEvery(); every == 0 {
				if !r.Sleep(wait) {
					return nil
				}
			} else if !r.Sleep(min(wait, max(every, watchDelay))) {
				// A failing watch read backs off like a failing round: a store outage
				// must not turn the watch into a tight loop.
				return nil
			}
			if time.Now().Before(next) {
				changed, err := c.membershipChanged(ctx)
				if err != nil {
					watchDelay = c.cfg.errorDelay(watchDelay)
				} else {
					watchDelay = 0
				}
				if !changed {
					continue
				}
			}
		}
		if c.skipRound() {
			next = time.Now().Add(c.cfg.LeaseRenewInterval)
			continue
		}
		// A streak older than a round is confirmed by a ping, so Ready reflects it;
		// one older than a lease makes the relay step aside.
		c.health.cutOff(ctx, c.cfg.now(), c.cfg.LeaseRenewInterval)
		if c.health.cutOff(ctx, c.cfg.now(), c.cfg.LeaseDuration) && !c.stepAside(r) {
			return nil
		}
		plan, err := c.coordinate(ctx)
		after(ctx, plan, err)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if fatal(err) {
				return err
			}
			if c.mustGiveWay() {
				if !c.giveWay(r, err) {
					return nil
				}
				next = time.Now()
				continue
			}
			errDelay = c.cfg.errorDelay(errDelay)
			c.log.Warn("relay: coordination round failed; retrying", "error", err, "retry_in", errDelay)
			next = time.Now().Add(errDelay)
			continue
		}
		errDelay = 0
		select {
		case rounds <- struct{}{}:
		default:
		}
		next = time.Now().Add(c.roundDelay(plan))
	}
	return nil
}

// roundDelay is how long after a round that produced plan the next one runs.
func (c *coordinator) roundDelay(plan leasePlan) time.Duration {
	delay := c.cfg.LeaseRenewInterval
	if plan.Unsettled {
		delay = c.cfg.settleInterval()
	}
	if !plan.NextChange.IsZero() {
		delay = min(delay, max(plan.NextChange.Sub(c.cfg.now()), 0)+c.cfg.lapseGrace())
	}
	return delay
}

// membershipChanged reads the relay records and reports whether they differ from the
// last round's view in what the plan depends on: which peers count (active, stopped
// or lapsed) and their bucket counts. A failed read reports no change, and its error;
// the regular round then sees what it missed.
func (c *coordinator) membershipChanged(ctx context.Context) (bool, error) {
	relays, err := c.store.ReadRelays(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug("relay: reading the relay records failed", "error", err)
		}
		return false, err
	}
	now := c.cfg.now()
	c.checkInstance(ctx, relays, now)
	c.mu.Lock()
	last := c.lastView.Relays
	c.mu.Unlock()
	return !slices.Equal(c.membership(relays, now), c.membership(last, now)), nil
}

// member is what a round's plan depends on in a peer's relay record.
type member struct {
	id          string
	active      bool
	bucketCount int
}

// membership lists the peers that count at now (and their bucket counts), or that
// are stopping and may hold leases.
func (c *coordinator) membership(relays []driver.RelayRecord, now time.Time) []member {
	var out []member
	for _, r := range relays {
		if r.ID == c.cfg.RelayID {
			continue
		}
		active := !r.Stopped() && now.Sub(r.LastSeen) < c.cfg.LeaseDuration
		if active || (r.Stopped() && now.Sub(r.StoppedAt) < c.cfg.LeaseDuration) {
			out = append(out, member{id: r.ID, active: active, bucketCount: r.BucketCount})
		}
	}
	return out
}

// skipRound reports whether a standby far back in line skips this round: it sends
// nothing every other round, as long as its heartbeat stays within three quarters of
// LeaseDuration.
func (c *coordinator) skipRound() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.farStandbyLocked() {
		return false
	}
	if c.round%2 == 1 {
		c.round++ // the skipped round counts, so the next one runs
		return true
	}
	return false
}

// watchEvery is how long the relay waits between its reads of the relay records
// between rounds, or 0 when it reads none: a standby far back in line reads none (no
// peer's stop can give it a bucket before its next round), and on a store that bills
// each request a relay alone in its fleet reads once between two rounds instead of
// every half PollInterval (no peer holds anything to take over; only a relay that
// joins waits a little longer for its share).
func (c *coordinator) watchEvery() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.farStandbyLocked():
		return 0
	case c.metered && c.lastPlan.Active == 1:
		return max(c.cfg.LeaseRenewInterval/2, c.cfg.watchInterval())
	}
	return c.cfg.watchInterval()
}

// farStandbyLocked reports whether the last plan made this relay a standby so far
// back in line (at least BucketCount standbys before it) that no stop or crash of a
// peer can give it a bucket before its next round: it skips every other round and
// the watch reads between them, as long as its heartbeat stays within three quarters
// of LeaseDuration.
func (c *coordinator) farStandbyLocked() bool {
	p := c.lastPlan
	return p.Standby && p.StandbyRank >= c.cfg.BucketCount && 4*2*c.cfg.LeaseRenewInterval <= 3*c.cfg.LeaseDuration
}

// stepAside hands this relay's buckets to its peers while it cannot reach its broker,
// and waits, pinging every PollInterval, until it can. It reports false if the worker
// was asked to stop meanwhile.
func (c *coordinator) stepAside(r lifecycle.Run) bool {
	ctx := r.Work
	c.log.Warn("relay: the broker has been unreachable for longer than a lease; handing this relay's buckets to peers until it answers",
		"lease_duration", c.cfg.LeaseDuration)
	if err := c.resign(ctx); err != nil && ctx.Err() == nil {
		c.log.Warn("relay: handing buckets back failed; they lapse after LeaseDuration", "error", err)
	}
	for {
		if !r.Sleep(c.cfg.PollInterval) {
			return false
		}
		if c.health.ping(ctx) == nil {
			c.log.Info("relay: the broker answers again; rejoining the fleet")
			return true
		}
	}
}

// mustGiveWay reports whether this relay's claims failed in giveWayAfter rounds in a
// row, and resets the count if so.
func (c *coordinator) mustGiveWay() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failedClaims < giveWayAfter {
		return false
	}
	c.failedClaims = 0
	return true
}

// giveWay hands this relay's share to its peers for a LeaseDuration because it cannot
// complete its claims (a slow link whose writes keep missing StoreTimeout): otherwise
// the plan would keep leaving it buckets it never takes. It stamps the relay stopped
// and hands back what it holds (if that fails too, its heartbeat and leases lapse, as
// no round runs meanwhile), waits, and rejoins. It reports false if the worker was
// asked to stop meanwhile.
func (c *coordinator) giveWay(r lifecycle.Run, cause error) bool {
	c.log.Warn("relay: claims keep failing; handing this relay's share to its peers for a lease, then rejoining (raise Config.StoreTimeout for a slow store)",
		"rounds", giveWayAfter, "lease_duration", c.cfg.LeaseDuration, "error", cause)
	if err := c.resign(r.Work); err != nil && r.Work.Err() == nil {
		c.log.Warn("relay: handing buckets back failed; they lapse after LeaseDuration", "error", err)
	}
	return r.Sleep(c.cfg.LeaseDuration)
}

// roundOK records a successful round of the worker, for Ready.
func (c *coordinator) roundOK() {
	c.mu.Lock()
	c.lastOK = c.cfg.now()
	c.mu.Unlock()
}

// ready reports whether the last round succeeded less than LeaseDuration ago, found
// no bucket count mismatch, and left this relay a standby or holding owned buckets of
// its fair share.
func (c *coordinator) ready(owned int) bool {
	c.mu.Lock()
	plan, at := c.lastPlan, c.lastOK
	c.mu.Unlock()
	if at.IsZero() || c.cfg.now().Sub(at) >= c.cfg.LeaseDuration || plan.Mismatch != nil {
		return false
	}
	if plan.Standby {
		return true
	}
	return plan.Share > 0 && owned >= plan.Share
}

// claimOne claims a free bucket outside the plan for one dispatch. It reads first, so
// a bucket another relay holds costs no refused write.
func (c *coordinator) claimOne(ctx context.Context, b int) (bool, error) {
	view, err := c.store.ReadCoordination(ctx)
	if err != nil {
		return false, err
	}
	now := c.cfg.now()
	for _, l := range view.Leases {
		if l.Bucket == b && !l.Free(now) {
			return false, nil
		}
	}
	exp := now.Add(c.cfg.LeaseDuration)
	ok, err := c.store.Claim(ctx, b, c.cfg.RelayID, now, exp)
	if err != nil {
		return false, err
	}
	if !ok {
		c.meter.refuse(ctx, "claim")
		return false, nil
	}
	c.leases.set(driver.Lease{Bucket: b, Owner: c.cfg.RelayID, ExpiresAt: exp})
	return true, nil
}

// releaseOne hands back one bucket's lease once no drain of it runs.
func (c *coordinator) releaseOne(ctx context.Context, b int) error {
	if err := c.leases.lock(ctx, b); err != nil {
		return err
	}
	defer c.leases.unlock(b)
	l, ok := c.leases.take(b)
	if !ok {
		return nil
	}
	released, err := c.store.Release(ctx, l)
	if err == nil && !released {
		c.meter.refuse(ctx, "release")
	}
	return err
}

// resignBounded resigns even if ctx has ended, trying for at most releaseBound, so a
// sweep cut short still hands its buckets back.
func (c *coordinator) resignBounded(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.releaseBound())
	defer cancel()
	return c.resign(rctx)
}
