package relay

import (
	"context"
	"slices"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// DefaultBacklogInterval is how often the relay holding bucket 0 samples the backlog.
const DefaultBacklogInterval = 30 * time.Second

// backlogSource samples the backlog: the store's [driver.BacklogSampler] if it has
// one, else its [driver.Admin] Stats.
type backlogSource func(ctx context.Context) (driver.Backlog, bool, error)

func newBacklogSource(store driver.Store) backlogSource {
	if s, ok := store.(driver.BacklogSampler); ok {
		return s.SampleBacklog
	}
	if a, ok := store.(driver.Admin); ok {
		return func(ctx context.Context) (driver.Backlog, bool, error) {
			st, err := a.Stats(ctx)
			return st, err == nil, err
		}
	}
	return nil
}

// backlogState is the last backlog sample. Guarded by Relay.backlogMu.
type backlogState struct {
	sample driver.Backlog
	at     time.Time
	// tried is when the last sample was attempted, successful or not.
	tried time.Time
}

// sampleBacklog samples the backlog if this relay may publish bucket 0 and the last
// attempt is at least BacklogInterval old. Only one relay of a fleet holds bucket 0,
// so the sample's cost does not grow with the fleet. A failed sample is logged at
// DEBUG and tried again at the next interval; it never fails the round.
func (d *Relay) sampleBacklog(ctx context.Context) {
	if d.backlog == nil || d.cfg.BacklogInterval < 0 {
		return
	}
	now := d.now()
	d.backlogMu.Lock()
	due := d.backlogState.tried.IsZero() || now.Sub(d.backlogState.tried) >= d.cfg.BacklogInterval || now.Before(d.backlogState.tried)
	d.backlogMu.Unlock()
	if !due || !d.publishable(0, now) {
		return
	}
	d.backlogMu.Lock()
	d.backlogState.tried = now
	d.backlogMu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, d.cfg.LeaseRenewInterval)
	st, ok, err := d.backlog(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			d.log.Debug("relay: sampling the backlog failed; trying again later", "error", err)
		}
		return
	}
	if !ok {
		return
	}
	at := d.now()
	d.backlogMu.Lock()
	d.backlogState.sample, d.backlogState.at = st, at
	d.backlogMu.Unlock()
	if d.obs != nil {
		d.obs.Backlog(ctx, st, at)
	}
}

// startSample samples the backlog in the background, if it is due and no sample is
// in flight, so a slow sample never delays the next round. The worker waits for it
// before it stops.
func (d *Relay) startSample(ctx context.Context) {
	if d.backlog == nil || d.cfg.BacklogInterval < 0 || !d.sampleBusy.CompareAndSwap(false, true) {
		return
	}
	d.sampling.Go(func() {
		defer d.sampleBusy.Store(false)
		d.sampleBacklog(ctx)
	})
}

// lastBacklog returns the last backlog sample and when it was taken (zero: none).
func (d *Relay) lastBacklog() (driver.Backlog, time.Time) {
	d.backlogMu.Lock()
	defer d.backlogMu.Unlock()
	st := d.backlogState.sample
	st.Pending = slices.Clone(st.Pending) // the caller's to keep
	return st, d.backlogState.at
}
