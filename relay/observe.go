package relay

import (
	"context"
	"sync/atomic"
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
	// InstanceClash reports a heartbeat of another live process found in this relay's
	// own record: self is this relay's instance, other the one that wrote it. Two
	// processes run under one relay ID; see [Stats.InstanceClashes].
	InstanceClash(ctx context.Context, self, other driver.Instance)
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

func (NopObserver) InstanceClash(context.Context, driver.Instance, driver.Instance) {}

var _ Observer = NopObserver{}

// meter counts what the relay did, for [Relay.Stats], and reports each event to the
// observer (never nil: [NopObserver] stands in for none).
type meter struct {
	obs Observer

	rounds, refused, published, retried, parked, deleted, outOfOrder, clashes atomic.Int64
}

func newMeter(obs Observer) *meter {
	if obs == nil {
		obs = NopObserver{}
	}
	return &meter{obs: obs}
}

// refuse counts a refused conditional write and reports it.
func (m *meter) refuse(ctx context.Context, op string) {
	m.refused.Add(1)
	m.obs.RefusedWrite(ctx, op)
}

// instanceClash counts another live instance seen under this relay's ID and reports it.
func (m *meter) instanceClash(ctx context.Context, self, other driver.Instance) {
	m.clashes.Add(1)
	m.obs.InstanceClash(ctx, self, other)
}

// abandoned reports a publish abandoned because the relay stops or the bucket's lease
// ran out.
func (m *meter) abandoned(ctx context.Context, batch []*driver.Envelope, start time.Time, took time.Duration, err error) {
	m.obs.Published(ctx, batch, nil, start, took, err)
}

func (m *meter) completed(ctx context.Context, envs []*driver.Envelope) {
	m.published.Add(int64(len(envs)))
	m.obs.Completed(ctx, envs)
}

func (m *meter) retry(ctx context.Context, env *driver.Envelope, attempts int, cause string) {
	m.retried.Add(1)
	m.obs.Retried(ctx, env, attempts, cause)
}

func (m *meter) park(ctx context.Context, env *driver.Envelope, permanent bool, cause string) {
	m.parked.Add(1)
	m.obs.Parked(ctx, env, permanent, cause)
}

func (m *meter) retentionDeleted(ctx context.Context, n int) {
	m.deleted.Add(int64(n))
	if n > 0 {
		m.obs.RetentionDeleted(ctx, n)
	}
}

// stats returns the counters.
func (m *meter) stats() Stats {
	return Stats{
		Rounds:        m.rounds.Load(),
		RefusedWrites: m.refused.Load(),
		Published:     m.published.Load(),
		Retried:       m.retried.Load(),
		Parked:        m.parked.Load(),
		Deleted:       m.deleted.Load(),
		OutOfOrder:    m.outOfOrder.Load(),

		InstanceClashes: m.clashes.Load(),
	}
}
