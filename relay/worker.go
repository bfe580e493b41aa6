package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// ErrRunning is returned by calls that cannot run while the worker runs:
// [Relay.RunOnce], and a second [Relay.Start].
var ErrRunning = errors.New("relay: the worker is running")

// releaseTimeout bounds handing the leases back once the context of the call that
// stops the relay has ended: see [Relay.releaseBound].
const releaseTimeout = 5 * time.Second

// releaseBound is how long the relay keeps trying to stamp itself stopped and hand its
// leases back after the caller's context ended (or without one, when the worker stops
// on its own): min(LeaseDuration, 5 s). Beyond LeaseDuration the leases lapse anyway.
func (d *Relay) releaseBound() time.Duration {
	return min(d.cfg.LeaseDuration, releaseTimeout)
}

// Start runs the worker in the background and returns once it runs. The worker
// coordinates leases every LeaseRenewInterval, drains its buckets every PollInterval
// and at once when the store announces a commit (if it implements
// [driver.Notifier]). ctx's values reach every store and transport call; cancelling
// ctx stops the worker gracefully, as [Relay.Stop] with a live context would:
// in-flight batches finish, then the worker hands its leases back.
//
// Start first checks that the store can be relayed from ([driver.Store]'s Check):
// on a store that was never migrated, or whose settings disagree, it returns an error
// wrapping [outbox.ErrMisconfigured] that names the fix, and starts nothing; a store
// it cannot reach fails Start too. A relay that Start refused may be started again.
//
// A relay starts once: Start while the worker runs returns an error wrapping
// [ErrRunning], and after it stopped (or was killed) one wrapping [outbox.ErrClosed].
// [Relay.Run] is Start, a wait and a graceful stop in one call.
func (d *Relay) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.life.Lock()
	defer d.life.Unlock()
	if d.started || d.killed {
		select {
		case <-d.stopped:
		default:
			if d.started {
				return fmt.Errorf("%w; Start called twice", ErrRunning)
			}
		}
		return fmt.Errorf("relay: %w: Start after the worker stopped; build a new relay to run again", outbox.ErrClosed)
	}
	if err := d.store.Check(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("relay: the store cannot be relayed from: %w", err)
	}
	d.started = true
	// hard ends everything, the final release included (Kill); work ends the drains
	// and rounds only (Stop whose context ended).
	hard, kill := context.WithCancel(context.WithoutCancel(ctx))
	work, cancel := context.WithCancel(hard)
	d.cancelWork, d.kill = cancel, kill
	unwatch := context.AfterFunc(ctx, d.requestStop)
	go func() {
		defer close(d.stopped)
		defer kill()
		defer unwatch()
		err := d.run(work)
		cancel()
		if err != nil {
			d.life.Lock()
			d.err = err
			d.life.Unlock()
			d.log.Error("relay: worker stopped on its own", "error", err)
		}
		if d.isKilled() {
			return // as after a crash: the leases lapse
		}
		if errors.As(err, new(countMismatch)) {
			return // the heartbeat stays, so peers stop too; the leases lapse
		}
		// Hand the leases back even when a Stop deadline cut the work short: peers
		// then take the buckets on their next round instead of after LeaseDuration.
		cleanup, cancelCleanup := context.WithTimeout(hard, d.releaseBound())
		defer cancelCleanup()
		if err := d.finish(cleanup); err != nil && !d.isKilled() {
			d.log.Warn("relay: could not release leases on stop; they lapse after LeaseDuration", "error", err)
		}
	}()
	return nil
}

// Run runs the relay until ctx ends or the worker stops on its own, and returns once
// every goroutine of the worker has ended: it is [Relay.Start], a wait, and the
// graceful stop that a cancelled ctx starts (in-flight batches finish, the leases are
// handed back). It returns Start's error if the relay cannot start (an unmigrated
// store: [outbox.ErrMisconfigured]), the error that stopped the worker on its own (see
// [Relay.Err]), or nil after ctx ended. It fits an errgroup:
//
//	g.Go(func() error { return r.Run(ctx) })
func (d *Relay) Run(ctx context.Context) error {
	if err := d.Start(ctx); err != nil {
		return err
	}
	<-d.stopped // a done ctx asks the worker to stop gracefully (Start)
	return d.Err()
}

// Stop stops the worker gracefully: it lets in-flight batches finish, stamps the relay
// stopped, hands its leases back (peers take the buckets on their next round) and
// returns once every goroutine of the worker has ended.
//
// If ctx ends first, Stop cancels the in-flight work (a batch cut short is not
// assumed sent and costs no attempt; it goes out again), still stamps the relay
// stopped and hands the leases back, trying for at most min(LeaseDuration, 5 s)
// more, and returns ctx's error. So `defer d.Stop(ctx)` with a context that is
// already cancelled at shutdown still hands the buckets over promptly. If the release
// fails (the store is unreachable) the leases lapse after LeaseDuration, as after a
// crash, and Stop returns the store's error (ctx's, if ctx ended); calling Stop again
// retries the release.
//
// Stop once the worker has stopped and handed its leases back, on a worker that was
// never started, or after [Relay.Kill] does nothing and returns nil. To stop
// without handing anything back, as a crash would, use Kill.
func (d *Relay) Stop(ctx context.Context) error {
	d.life.Lock()
	started := d.started
	d.life.Unlock()
	if !started || d.isKilled() {
		return nil
	}
	d.requestStop()
	select {
	case <-d.stopped:
	case <-ctx.Done():
		d.cancelWork()
		<-d.stopped // the worker releases on its way out, within releaseBound
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d.isKilled() {
		return nil
	}
	// The worker released on its way out; if that failed, this retries.
	return d.finish(ctx)
}

// Kill stops the worker at once, as if the process had died: it cancels in-flight
// work, does not stamp the relay stopped and hands no lease back, so the relay's
// buckets stay with it until its leases lapse, LeaseDuration after its last renewal,
// and only then move to its peers. A graceful stop under way is cut short: the leases
// it has not handed back yet lapse. Kill returns once every goroutine of the worker
// has ended; [Relay.Stop] after it does nothing and [Relay.Start] fails.
//
// Kill is for tests and crash drills: in production use Stop, which hands the
// buckets over at once. Kill on a relay that was never started only keeps it
// from starting.
func (d *Relay) Kill() {
	d.life.Lock()
	d.killed = true
	started := d.started
	d.life.Unlock()
	if !started {
		return
	}
	d.requestStop()
	d.kill()
	<-d.stopped
}

func (d *Relay) isKilled() bool {
	d.life.Lock()
	defer d.life.Unlock()
	return d.killed
}

// Stopped is closed once the worker has stopped, by [Relay.Stop],
// [Relay.Kill], a cancelled Start context, or on its own (see [Relay.Err]).
// When it closes after a graceful stop, the release of the leases has been tried.
func (d *Relay) Stopped() <-chan struct{} { return d.stopped }

// Err reports why the worker stopped on its own: settings that disagree, such as
// relays or envelopes with another bucket count or a table that went missing
// ([outbox.ErrMisconfigured]), or a closed store ([outbox.ErrClosed]). It is nil
// while the worker runs and after a Stop or Kill. [Relay.Run] returns it.
func (d *Relay) Err() error {
	d.life.Lock()
	defer d.life.Unlock()
	return d.err
}

func (d *Relay) requestStop() { d.stopOnce.Do(func() { close(d.stopReq) }) }

// finish resigns the relay once.
func (d *Relay) finish(ctx context.Context) error {
	d.finishMu.Lock()
	defer d.finishMu.Unlock()
	if d.resigned.Load() {
		return nil
	}
	err := d.resign(ctx)
	if err == nil || errors.Is(err, outbox.ErrClosed) {
		// A closed store cannot take a retry: the leases lapse.
		d.resigned.Store(true)
	}
	return err
}

// run is the worker: the coordination rounds and the drains run side by side, so a
// slow publish never delays a renewal and a slow round never delays a publish. It
// returns nil when asked to stop, or the error that stops the worker for good.
func (d *Relay) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rounds := make(chan struct{}, 1)
	var coordErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		coordErr = d.coordinateLoop(ctx, rounds)
		if coordErr != nil {
			cancel()
		}
	})
	err := d.drainLoop(ctx, rounds)
	cancel()
	wg.Wait()
	d.sampling.Wait() // a backlog sample in flight (backlog.go)
	if coordErr != nil {
		return coordErr
	}
	return err
}

// fatal reports the errors that stop the worker: settings that disagree, or a closed
// store.
func fatal(err error) bool {
	return errors.Is(err, outbox.ErrMisconfigured) || errors.Is(err, outbox.ErrClosed)
}

// stopping reports whether the worker was asked to stop.
func (d *Relay) stopping(ctx context.Context) bool {
	select {
	case <-d.stopReq:
		return true
	default:
		return ctx.Err() != nil
	}
}

// sleep waits for wait, a stop or ctx's end; it reports false on the latter two.
func (d *Relay) sleep(ctx context.Context, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-d.stopReq:
		return false
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

// Timings of the coordination loop, derived from the configuration:
//
//   - watchInterval: between rounds the relay reads the relay records (one small
//     read) this often, and runs a round at once when a peer joined, stopped, lapsed
//     or changed its bucket count: half of PollInterval (at most half of
//     LeaseRenewInterval), 500 ms by default.
//   - settleInterval: while the fleet moves buckets (the plan is unsettled) rounds
//     follow each other this often: half the watch interval, 250 ms by default.
//   - lapseGrace: a round is run this long after the next time the plan can change
//     by time alone (a peer's lease or heartbeat lapses): 1 % of LeaseDuration, at
//     most 250 ms.
func (d *Relay) watchInterval() time.Duration {
	return max(min(d.cfg.PollInterval, d.cfg.LeaseRenewInterval)/2, time.Millisecond)
}

func (d *Relay) settleInterval() time.Duration {
	return max(d.watchInterval()/2, time.Millisecond)
}

func (d *Relay) lapseGrace() time.Duration {
	return min(d.cfg.LeaseDuration/100, 250*time.Millisecond)
}

// coordinateLoop runs the coordination rounds on their own clock: every
// LeaseRenewInterval in steady state, at once when the watch read sees the membership
// change, every settleInterval while buckets move, and just after a peer's lease or
// heartbeat lapses. It signals rounds after each round.
func (d *Relay) coordinateLoop(ctx context.Context, rounds chan<- struct{}) error {
	var errDelay, watchDelay time.Duration
	next := time.Now()
	for !d.stopping(ctx) {
		if wait := time.Until(next); wait > 0 {
			// A failing watch read backs off like a failing round: a store outage
			// must not turn the watch into a tight loop.
			if !d.sleep(ctx, min(wait, max(d.watchInterval(), watchDelay))) {
				return nil
			}
			if time.Now().Before(next) {
				changed, err := d.membershipChanged(ctx)
				if err != nil {
					watchDelay = min(max(2*watchDelay, 50*time.Millisecond), d.cfg.LeaseRenewInterval)
				} else {
					watchDelay = 0
				}
				if !changed {
					continue
				}
			}
		}
		if d.skipRound() {
			next = time.Now().Add(d.cfg.LeaseRenewInterval)
			continue
		}
		if d.health.cutOff(ctx, d.now(), d.cfg.LeaseDuration) {
			if !d.stepAside(ctx) {
				return nil
			}
		}
		plan, err := d.coordinate(ctx)
		d.afterRound(ctx, plan, err)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if fatal(err) {
				return err
			}
			errDelay = min(max(2*errDelay, 50*time.Millisecond), d.cfg.LeaseRenewInterval)
			d.log.Warn("relay: coordination round failed; retrying", "error", err, "retry_in", errDelay)
			next = time.Now().Add(errDelay)
			continue
		}
		errDelay = 0
		select {
		case rounds <- struct{}{}:
		default:
		}
		next = time.Now().Add(d.roundDelay(plan))
	}
	return nil
}

// roundDelay is how long after a round that produced plan the next one runs.
func (d *Relay) roundDelay(plan leasePlan) time.Duration {
	delay := d.cfg.LeaseRenewInterval
	if plan.Unsettled {
		delay = d.settleInterval()
	}
	if !plan.NextChange.IsZero() {
		delay = min(delay, max(plan.NextChange.Sub(d.now()), 0)+d.lapseGrace())
	}
	return delay
}

// membershipChanged reads the relay records and reports whether they differ from the
// last round's view in what the plan depends on: which peers count (active, stopped
// or lapsed) and their bucket counts. A failed read reports no change, and its error;
// the regular round then sees what it missed.
func (d *Relay) membershipChanged(ctx context.Context) (bool, error) {
	relays, err := d.store.ReadRelays(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Debug("relay: reading the relay records failed", "error", err)
		}
		return false, err
	}
	now := d.now()
	d.coordMu.Lock()
	last := d.lastView.Relays
	d.coordMu.Unlock()
	return !slices.Equal(d.membership(relays, now), d.membership(last, now)), nil
}

// member is what a round's plan depends on in a peer's relay record.
type member struct {
	id          string
	active      bool
	bucketCount int
}

// membership lists the peers that count at now (and their bucket counts), or that
// are stopping and may hold leases.
func (d *Relay) membership(relays []driver.RelayRecord, now time.Time) []member {
	var out []member
	for _, r := range relays {
		if r.ID == d.cfg.RelayID {
			continue
		}
		active := !r.Stopped() && now.Sub(r.LastSeen) < d.cfg.LeaseDuration
		if active || (r.Stopped() && now.Sub(r.StoppedAt) < d.cfg.LeaseDuration) {
			out = append(out, member{id: r.ID, active: active, bucketCount: r.BucketCount})
		}
	}
	return out
}

// drainLoop drains the buckets this relay holds: those a commit wake-up names, and
// every one at each PollInterval and after each round. It returns nil when asked to
// stop, or the error that stops the worker for good.
func (d *Relay) drainLoop(ctx context.Context, rounds <-chan struct{}) error {
	var wake <-chan int
	if d.notifier != nil {
		subCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		wake = d.notifier.Subscribe(subCtx)
	}
	var (
		errDelay time.Duration
		woken    = make(map[int]bool)
		// all: poll every held bucket; cleanup: a round ran, so retention may be due.
		all, cleanup = false, false
	)
	// pause waits for d, a stop, a round or (when wakeable) a wake-up; it reports
	// false on a stop. An error backoff is not wakeable: commits keep coming while the
	// store fails, and each would otherwise cut the backoff short.
	pause := func(wait time.Duration, wakeable bool) bool {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		for {
			select {
			case <-d.stopReq:
				return false
			case <-ctx.Done():
				return false
			case <-timer.C:
				all = true
				return true
			case <-rounds:
				all, cleanup = true, true
				if wakeable {
					return true
				}
			case b, ok := <-wake:
				if !ok {
					wake = nil
					continue
				}
				woken[b] = true
				if wakeable {
					return true
				}
			}
		}
	}
	failed := func(err error) bool {
		errDelay = min(max(2*errDelay, 50*time.Millisecond), d.cfg.LeaseRenewInterval)
		d.log.Warn("relay: store or transport error; backing off", "error", err, "retry_in", errDelay)
		return pause(errDelay, false)
	}

	for !d.stopping(ctx) {
		// Collect wake-ups and rounds that arrived while busy.
	collect:
		for {
			select {
			case b, ok := <-wake:
				if !ok {
					wake = nil
					break collect
				}
				woken[b] = true
			case <-rounds:
				all, cleanup = true, true
			default:
				break collect
			}
		}
		if cleanup {
			cleanup = false
			if _, err := d.cleanupRetention(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("relay: retention cleanup failed", "error", err)
			}
		}
		var buckets []int
		for _, b := range d.Owned() {
			switch {
			case woken[b]:
				buckets = append(buckets, b)
			case all && d.mayHavePending(ctx, b):
				buckets = append(buckets, b)
			}
		}
		clear(woken)
		all = false
		_, more, err := d.drainBuckets(ctx, buckets, false)
		if err != nil {
			if fatal(err) {
				return err
			}
			if ctx.Err() != nil {
				return nil
			}
			if !failed(err) {
				return nil
			}
			continue
		}
		errDelay = 0
		if len(more) > 0 {
			for _, b := range more {
				woken[b] = true
			}
			continue
		}
		if !pause(d.cfg.PollInterval, true) {
			return nil
		}
	}
	return nil
}

// skipRound reports whether a standby far back in line skips this round: it sends
// nothing every other round, as long as its heartbeat stays within three quarters of
// LeaseDuration.
func (d *Relay) skipRound() bool {
	d.coordMu.Lock()
	defer d.coordMu.Unlock()
	p := d.lastPlan
	if !p.Standby || p.StandbyRank < d.cfg.BucketCount || 4*2*d.cfg.LeaseRenewInterval > 3*d.cfg.LeaseDuration {
		return false
	}
	if d.round%2 == 1 {
		d.round++ // the skipped round counts, so the next one runs
		return true
	}
	return false
}

// mayHavePending asks the store's cheap idle probe, if it has one, whether a polled
// bucket is worth a full fetch. A probe error answers yes: the fetch then reports it.
func (d *Relay) mayHavePending(ctx context.Context, bucket int) bool {
	if d.prober == nil {
		return true
	}
	pending, err := d.prober.HasPending(ctx, bucket)
	return pending || err != nil
}
