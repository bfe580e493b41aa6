package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/lifecycle"
)

// ErrRunning is returned by calls that cannot run while the worker runs:
// [Relay.RunOnce], and a second [Relay.Start].
var ErrRunning = errors.New("relay: the worker is running")

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
	check := func() error {
		d.coord.clash.started(d.cfg.now()) // heartbeats dated before are a predecessor's
		// Start's check is a one-off, not a lease write: it may take a lease's time
		// (it may record the bucket count) before it counts as a failure.
		store := d.coord.store
		if b, ok := store.(deadlined); ok {
			b.timeout = max(b.timeout, d.cfg.LeaseDuration)
			store = b
		}
		if err := store.Check(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("relay: the store cannot be relayed from: %w", err)
		}
		return nil
	}
	err := d.worker.Start(ctx, check, d.work)
	switch {
	case errors.Is(err, lifecycle.ErrRunning):
		return fmt.Errorf("%w; Start called twice", ErrRunning)
	case errors.Is(err, lifecycle.ErrEnded):
		return fmt.Errorf("relay: %w: Start after the worker stopped; build a new relay to run again", outbox.ErrClosed)
	}
	return err
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
	<-d.worker.Done() // a done ctx asks the worker to stop gracefully (Start)
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
// fails (the store is unreachable; a write that outlasts StoreTimeout is tried again
// while there is time) the leases lapse after LeaseDuration, as after a
// crash, and Stop returns the store's error (ctx's, if ctx ended); calling Stop again
// retries the release.
//
// Stop once the worker has stopped and handed its leases back, on a worker that was
// never started, or after [Relay.Kill] does nothing and returns nil. To stop
// without handing anything back, as a crash would, use Kill.
func (d *Relay) Stop(ctx context.Context) error {
	if !d.worker.Started() || d.worker.Killed() {
		return nil
	}
	// If ctx ends first, the worker's work is cancelled; it releases on its way
	// out, within releaseBound.
	if err := d.worker.Stop(ctx); err != nil {
		return err
	}
	if d.worker.Killed() {
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
func (d *Relay) Kill() { d.worker.Kill() }

// Stopped is closed once the worker has stopped, by [Relay.Stop],
// [Relay.Kill], a cancelled Start context, or on its own (see [Relay.Err]).
// When it closes after a graceful stop, the release of the leases has been tried.
func (d *Relay) Stopped() <-chan struct{} { return d.worker.Done() }

// Err reports why the worker stopped on its own: settings that disagree, such as
// relays or envelopes with another bucket count or a table that went missing
// ([outbox.ErrMisconfigured]), or a closed store ([outbox.ErrClosed]). It is nil
// while the worker runs and after a Stop or Kill. [Relay.Run] returns it.
func (d *Relay) Err() error { return d.worker.Err() }

// work is the worker's life: run, then, unless it was killed or stopped for a bucket
// count mismatch, hand the leases back, even when a Stop deadline cut the work short:
// peers then take the buckets on their next round instead of after LeaseDuration.
func (d *Relay) work(r lifecycle.Run) error {
	err := d.run(r)
	if err != nil {
		d.log.Error("relay: worker stopped on its own", "error", err)
	}
	if d.worker.Killed() {
		return err // as after a crash: the leases lapse
	}
	if errors.As(err, new(countMismatch)) {
		return err // the heartbeat stays, so peers stop too; the leases lapse
	}
	cleanup, cancel := context.WithTimeout(r.Final, d.cfg.releaseBound())
	defer cancel()
	if ferr := d.finish(cleanup); ferr != nil && !d.worker.Killed() {
		d.log.Warn("relay: could not release leases on stop; they lapse after LeaseDuration", "error", ferr)
	}
	return err
}

// run runs the coordinator's rounds and the drainer side by side, so a slow publish
// never delays a renewal and a slow round never delays a publish. It returns nil when
// asked to stop, or the error that stops the worker for good.
func (d *Relay) run(r lifecycle.Run) error {
	ctx, cancel := context.WithCancel(r.Work)
	defer cancel()
	r.Work = ctx
	rounds := make(chan struct{}, 1)
	var coordErr, streamErr error
	var wg sync.WaitGroup
	if d.stream != nil {
		// The stream's reader (streamer.go), beside the rounds and the drains.
		wg.Go(func() {
			streamErr = d.stream.loop(r)
			if streamErr != nil {
				cancel()
			}
		})
	}
	wg.Go(func() {
		coordErr = d.coord.loop(r, rounds, d.afterRound)
		if coordErr != nil {
			cancel()
		}
	})
	err := d.drain.loop(r, rounds, d.cleanupRetention)
	cancel()
	wg.Wait()
	d.backlog.wait()
	if coordErr != nil {
		return coordErr
	}
	if streamErr != nil {
		return streamErr
	}
	return err
}

// afterRound runs after each coordination round of the worker: it records a
// successful round for [Relay.Ready], reports the round to the observer and
// samples the backlog when it is due.
func (d *Relay) afterRound(ctx context.Context, plan leasePlan, err error) {
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		d.coord.roundOK()
	}
	d.meter.obs.Round(ctx, len(d.Owned()), plan.Standby, err)
	if err == nil {
		d.backlog.start(ctx)
	}
}

// cleanupRetention runs the worker's retention cleanup after a round.
func (d *Relay) cleanupRetention(ctx context.Context) {
	if _, err := d.retention.cleanup(ctx); err != nil && ctx.Err() == nil {
		d.log.Warn("relay: retention cleanup failed", "error", err)
	}
}

// finish resigns the relay once.
func (d *Relay) finish(ctx context.Context) error {
	d.finishMu.Lock()
	defer d.finishMu.Unlock()
	if d.resigned.Load() {
		return nil
	}
	err := d.coord.resign(ctx)
	if err == nil || errors.Is(err, outbox.ErrClosed) {
		// A closed store cannot take a retry: the leases lapse.
		d.resigned.Store(true)
	}
	return err
}

// fatal reports the errors that stop the worker: settings that disagree, or a closed
// store.
func fatal(err error) bool {
	return errors.Is(err, outbox.ErrMisconfigured) || errors.Is(err, outbox.ErrClosed)
}
