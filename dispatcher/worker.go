package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outbox"
)

// Start runs the worker in the background and returns once it runs. The worker
// coordinates leases every LeaseRenewInterval, drains its buckets every PollInterval
// and at once when the store announces a commit (if it implements
// [outbox.Notifier]). ctx's values reach every store and transport call; cancelling
// ctx stops the worker as [Dispatcher.Stop] would. A dispatcher starts once.
func (d *Dispatcher) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.life.Lock()
	defer d.life.Unlock()
	if d.started {
		return fmt.Errorf("dispatcher: %w: Start called twice; build a new dispatcher to run again", outbox.ErrClosed)
	}
	d.started = true
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancelWork = cancel
	unwatch := context.AfterFunc(ctx, d.requestStop)
	go func() {
		defer close(d.stopped)
		defer cancel()
		defer unwatch()
		err := d.run(work)
		if err != nil {
			d.life.Lock()
			d.err = err
			d.life.Unlock()
			d.log.Error("dispatcher: worker stopped on its own", "error", err)
		}
		if work.Err() != nil {
			return // a Stop deadline cut in-flight work short: leases lapse
		}
		cleanup, cancelCleanup := context.WithTimeout(work, d.cfg.LeaseDuration)
		defer cancelCleanup()
		if err := d.finish(cleanup); err != nil {
			d.log.Warn("dispatcher: could not release leases on stop; they lapse after LeaseDuration", "error", err)
		}
	}()
	return nil
}

// Stop stops the worker: it lets in-flight batches finish, stamps the relay stopped,
// releases its leases and returns once every goroutine of the worker has ended. If
// ctx ends first, in-flight work is cancelled, the leases are left to lapse as after a
// crash, and Stop returns ctx's error; calling Stop again retries the release. Stop
// on a worker that is not running, or already stopped, returns nil.
func (d *Dispatcher) Stop(ctx context.Context) error {
	d.life.Lock()
	started := d.started
	d.life.Unlock()
	if !started {
		return nil
	}
	d.requestStop()
	select {
	case <-d.stopped:
	case <-ctx.Done():
		d.cancelWork()
		<-d.stopped
		return ctx.Err()
	}
	return d.finish(ctx)
}

// Stopped is closed once the worker has stopped, by [Dispatcher.Stop] or on its own
// (see [Dispatcher.Err]).
func (d *Dispatcher) Stopped() <-chan struct{} { return d.stopped }

// Err reports why the worker stopped on its own: an envelope written with another
// bucket count ([outbox.ErrMisconfigured]) or a closed store ([outbox.ErrClosed]). It is nil while the worker runs
// and after a plain Stop.
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
