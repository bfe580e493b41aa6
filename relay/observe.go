package relay

import (
	"context"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// Observer receives the relay's measurements as they happen, for metrics. Set
// one in [Config.Observer]; without one the relay measures nothing beyond its
// own counters ([Relay.Stats]) and pays nothing for it.
//
// The relay calls the observer synchronously from its drains and rounds, often
// from several goroutines at once: methods must be safe for concurrent use, return
// quickly and never block (record into instruments; do not do I/O). The envelopes
// passed in belong to the relay: read them during the call, never keep or change
// them. An observer that turns topics into metric attributes must bound their number
// itself (the OpenTelemetry observer in package outboxotel does).
//
// Embed [NopObserver] to implement only some methods and stay compatible when
// methods are added.
type Observer interface {
	// Published reports one Transport.Publish call: the batch sent, the envelopes the
	// broker acknowledged (all of the batch when err is nil), when the call started,
	// how long it took and its error. acked[i].CreatedAt to start+took is each
	// message's end-to-end lag, capture to broker acknowledgement. A call abandoned
	// because the relay stops or its lease ran out is reported with acked empty and
	// err set.
	Published(ctx context.Context, batch, acked []*driver.Envelope, start time.Time, took time.Duration, err error)
	// Completed reports envelopes the store forgot (deleted, or marked dispatched with
	// retention) after the broker acknowledged them: [Stats.Published] counts them.
	Completed(ctx context.Context, envs []*driver.Envelope)
	// Retried reports an envelope rescheduled after a failed attempt (its attempts
	// count after the failure, and the cause).
	Retried(ctx context.Context, env *driver.Envelope, attempts int, cause string)
	// Parked reports an envelope parked: permanent if its failure was marked
	// [driver.Permanent], otherwise it ran out of attempts.
	Parked(ctx context.Context, env *driver.Envelope, permanent bool, cause string)
	// RetentionDeleted reports n dispatched envelopes deleted by retention cleanup.
	RetentionDeleted(ctx context.Context, n int)
	// RefusedWrite reports one conditional write the store refused; op is one of
	// "heartbeat", "claim", "renew", "release" or "delete_relay".
	RefusedWrite(ctx context.Context, op string)
	// Round reports a coordination round of the worker that ended: how many buckets
	// the relay may publish from afterwards, whether it is a standby, and the round's
	// error (nil on success). Rounds of RunOnce are reported by RefusedWrite and the
	// other calls only.
	Round(ctx context.Context, owned int, standby bool, err error)
	// Backlog reports a backlog sample, taken by the relay that holds bucket 0 every
	// [Config.BacklogInterval]: see [Stats.Backlog].
	Backlog(ctx context.Context, sample driver.Backlog, at time.Time)
}

// NopObserver implements [Observer] and does nothing. Embed it in an observer that
// implements only some methods.
type NopObserver struct{}

func (NopObserver) Published(context.Context, []*driver.Envelope, []*driver.Envelope, time.Time, time.Duration, error) {
}
func (NopObserver) Completed(context.Context, []*driver.Envelope)          {}
func (NopObserver) Retried(context.Context, *driver.Envelope, int, string) {}
func (NopObserver) Parked(context.Context, *driver.Envelope, bool, string) {}
func (NopObserver) RetentionDeleted(context.Context, int)                  {}
func (NopObserver) RefusedWrite(context.Context, string)                   {}
func (NopObserver) Round(context.Context, int, bool, error)                {}
func (NopObserver) Backlog(context.Context, driver.Backlog, time.Time)     {}

var _ Observer = NopObserver{}

// refuse counts a refused conditional write and reports it.
func (d *Relay) refuse(ctx context.Context, op string) {
	d.refused.Add(1)
	if d.obs != nil {
		d.obs.RefusedWrite(ctx, op)
	}
}

// observeAbandoned reports a publish abandoned because the relay stops or the
// bucket's lease ran out.
func (d *Relay) observeAbandoned(ctx context.Context, batch []*driver.Envelope, start time.Time, took time.Duration, err error) {
	if d.obs != nil {
		d.obs.Published(ctx, batch, nil, start, took, err)
	}
}

// Ready reports whether the worker is running and in a valid plan: its last
// coordination round succeeded less than LeaseDuration ago, found no bucket count
// mismatch, and the relay either holds its whole fair share or is a standby (the
// fleet has more relays than buckets). A relay that just started, is still taking
// over buckets from its peers, cannot reach the store, or has stopped is not ready.
// It suits a readiness probe.
func (d *Relay) Ready() bool {
	if !d.running() {
		return false
	}
	d.coordMu.Lock()
	plan, at := d.lastPlan, d.lastRoundOK
	d.coordMu.Unlock()
	if at.IsZero() || d.now().Sub(at) >= d.cfg.LeaseDuration || plan.Mismatch != nil {
		return false
	}
	if plan.Standby {
		return true
	}
	return plan.Share > 0 && len(d.Owned()) >= plan.Share
}

// afterRound runs after each coordination round of the worker: it records a
// successful round for [Relay.Ready], reports the round to the observer and
// samples the backlog when it is due.
func (d *Relay) afterRound(ctx context.Context, plan leasePlan, err error) {
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		d.coordMu.Lock()
		d.lastRoundOK = d.now()
		d.coordMu.Unlock()
	}
	if d.obs != nil {
		d.obs.Round(ctx, len(d.Owned()), plan.Standby, err)
	}
	if err == nil {
		d.startSample(ctx)
	}
}
