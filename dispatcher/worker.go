package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outbox"
)

// ErrRunning is returned by calls that cannot run while the worker runs:
// [Dispatcher.RunOnce], and a second [Dispatcher.Start].
var ErrRunning = errors.New("dispatcher: the worker is running")

// releaseTimeout bounds handing the leases back once the context of the call that
// stops the relay has ended: see [Dispatcher.releaseBound].
const releaseTimeout = 5 * time.Second

// releaseBound is how long the relay keeps trying to stamp itself stopped and hand its
// leases back after the caller's context ended (or without one, when the worker stops
// on its own): min(LeaseDuration, 5 s). Beyond LeaseDuration the leases lapse anyway.
func (d *Dispatcher) releaseBound() time.Duration {
	return min(d.cfg.LeaseDuration, releaseTimeout)
}

// Start runs the worker in the background and returns once it runs. The worker
// coordinates leases every LeaseRenewInterval, drains its buckets every PollInterval
// and at once when the store announces a commit (if it implements
// [outbox.Notifier]). ctx's values reach every store and transport call; cancelling
// ctx stops the worker gracefully, as [Dispatcher.Stop] with a live context would:
// in-flight batches finish, then the worker hands its leases back.
//
// A dispatcher starts once: Start while the worker runs returns an error wrapping
// [ErrRunning], and after it stopped (or was killed) one wrapping [outbox.ErrClosed].
func (d *Dispatcher) Start(ctx context.Context) error {
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
		return fmt.Errorf("dispatcher: %w: Start after the worker stopped; build a new dispatcher to run again", outbox.ErrClosed)
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
			d.log.Error("dispatcher: worker stopped on its own", "error", err)
		}
		if d.isKilled() {
			return // as after a crash: the leases lapse
		}
		// Hand the leases back even when a Stop deadline cut the work short: peers
		// then take the buckets on their next round instead of after LeaseDuration.
		cleanup, cancelCleanup := context.WithTimeout(hard, d.releaseBound())
		defer cancelCleanup()
		if err := d.finish(cleanup); err != nil && !d.isKilled() {
			d.log.Warn("dispatcher: could not release leases on stop; they lapse after LeaseDuration", "error", err)
		}
	}()
	return nil
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
// never started, or after [Dispatcher.Kill] does nothing and returns nil. To stop
// without handing anything back, as a crash would, use Kill.
func (d *Dispatcher) Stop(ctx context.Context) error {
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
// has ended; [Dispatcher.Stop] after it does nothing and [Dispatcher.Start] fails.
//
// Kill is for tests and crash drills: in production use Stop, which hands the
// buckets over at once. Kill on a dispatcher that was never started only keeps it
// from starting.
func (d *Dispatcher) Kill() {
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

func (d *Dispatcher) isKilled() bool {
	d.life.Lock()
	defer d.life.Unlock()
	return d.killed
}

// Stopped is closed once the worker has stopped, by [Dispatcher.Stop],
// [Dispatcher.Kill], a cancelled Start context, or on its own (see [Dispatcher.Err]).
// When it closes after a graceful stop, the release of the leases has been tried.
func (d *Dispatcher) Stopped() <-chan struct{} { return d.stopped }

// Err reports why the worker stopped on its own: an envelope written with another
// bucket count ([outbox.ErrMisconfigured]) or a closed store ([outbox.ErrClosed]). It
// is nil while the worker runs and after a Stop or Kill.
func (d *Dispatcher) Err() error {
	d.life.Lock()
	defer d.life.Unlock()
	return d.err
}

func (d *Dispatcher) requestStop() { d.stopOnce.Do(func() { close(d.stopReq) }) }

// finish resigns the relay once.
func (d *Dispatcher) finish(ctx context.Context) error {
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

// run is the worker loop. It returns nil when asked to stop, or the error that
// stops the worker for good.
func (d *Dispatcher) run(ctx context.Context) error {
	var wake <-chan int
	if d.notifier != nil {
		subCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		wake = d.notifier.Subscribe(subCtx)
	}
	var (
		nextRound time.Time // real time of the next coordination round
		errDelay  time.Duration
		woken     = make(map[int]bool)
		all       = true
	)
	stopping := func() bool {
		select {
		case <-d.stopReq:
			return true
		default:
			return ctx.Err() != nil
		}
	}
	// pause waits for d, a stop, or (when wakeable) a wake-up; it reports false on a
	// stop. An error backoff is not wakeable: commits keep coming while the store
	// fails, and each would otherwise cut the backoff short.
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
	// fatal errors stop the worker: settings that disagree, or a closed store.
	fatal := func(err error) bool {
		return errors.Is(err, outbox.ErrMisconfigured) || errors.Is(err, outbox.ErrClosed)
	}
	failed := func(err error) bool {
		errDelay = min(max(2*errDelay, 50*time.Millisecond), d.cfg.LeaseRenewInterval)
		d.log.Warn("dispatcher: store or transport error; backing off", "error", err, "retry_in", errDelay)
		return pause(errDelay, false)
	}

	for !stopping() {
		if !time.Now().Before(nextRound) {
			if d.skipRound() {
				nextRound = time.Now().Add(d.cfg.LeaseRenewInterval)
			} else {
				if err := d.coordinate(ctx); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					if fatal(err) {
						return err
					}
					if !failed(err) {
						return nil
					}
					continue
				}
				nextRound = time.Now().Add(d.cfg.LeaseRenewInterval)
				all = true
				if _, err := d.cleanupRetention(ctx); err != nil && ctx.Err() == nil {
					d.log.Warn("dispatcher: retention cleanup failed", "error", err)
				}
			}
		}

		// Collect wake-ups that arrived while busy.
	collect:
		for {
			select {
			case b, ok := <-wake:
				if !ok {
					wake = nil
					break collect
				}
				woken[b] = true
			default:
				break collect
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
		wait := min(d.cfg.PollInterval, time.Until(nextRound))
		if !pause(max(wait, time.Millisecond), true) {
			return nil
		}
	}
	return nil
}

// skipRound reports whether a standby far back in line skips this round: it sends
// nothing every other round, as long as its heartbeat stays within three quarters of
// LeaseDuration.
func (d *Dispatcher) skipRound() bool {
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
func (d *Dispatcher) mayHavePending(ctx context.Context, bucket int) bool {
	if d.prober == nil {
		return true
	}
	pending, err := d.prober.HasPending(ctx, bucket)
	return pending || err != nil
}
