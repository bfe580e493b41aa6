package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
)

// Topic is the topic every message of a run is sent to.
const Topic = "chaos"

// errRollback is what a unit of work returns to roll back on purpose.
var errRollback = errors.New("chaos: deliberate rollback")

// Run runs one chaos scenario on a fresh store from h, logs the report and fails t if
// the run could not be set up or a guarantee was broken. It returns the report.
func Run(t *testing.T, h outboxtest.StoreHarness, cfg Config) Report {
	t.Helper()
	rep, err := Execute(t, h, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("chaos report:\n%s", rep)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	return rep
}

// Execute runs one chaos scenario on a fresh store from h and returns its report
// without judging it: [Report.Err] says whether a guarantee was broken. The error is
// for a run that could not be set up (a Config field that cannot work, a harness
// without New, a dispatcher that would not start).
//
// The writers run their units of work through h.Transact, or the store's own
// [outbox.Transactor.Transact] when it is nil.
func Execute(t *testing.T, h outboxtest.StoreHarness, cfg Config) (Report, error) {
	t.Helper()
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Report{}, err
	}
	if h.New == nil {
		return Report{}, errors.New("chaos: the harness needs New (StoreHarness.New)")
	}
	if h.Transact == nil {
		h.Transact = func(ctx context.Context, s outboxtest.Store, fn func(ctx context.Context) error) error {
			return s.Transact(ctx, fn)
		}
	}
	store := h.New(t, cfg.BucketCount)
	defer func() { _ = store.Close() }()
	r := &runner{t: t, cfg: cfg, store: store, h: h, rec: outboxtest.NewRecorder()}
	return r.run()
}

// runner holds one run's state.
type runner struct {
	t     *testing.T
	cfg   Config
	store outboxtest.Store
	h     outboxtest.StoreHarness
	rec   *outboxtest.Recorder

	faulty atomic.Bool  // transport faults on
	down   atomic.Bool  // broker outage
	skew   atomic.Int64 // how far relay slot 0's clock is set back, in ns
	// refusedInOutage counts publishes refused by the outage.
	refusedInOutage atomic.Int64

	mu         sync.Mutex
	slots      []*slotRelay // current relay per slot; nil while crashed or stopped
	transports []*outboxtest.FaultTransport
	generation int
	stats      relay.Stats // of dispatchers that stopped
	problems   []string

	// Written by the writers, read after they finish.
	committed  map[msgID]bool
	rolledBack map[msgID]bool
}

type slotRelay struct {
	d        *relay.Relay
	cancel   context.CancelFunc
	inflight *atomic.Int32    // publishes under way
	handle   outboxtest.Store // the relay's own store handle, if reopened
}

// msgID identifies a message by key and sequence number, as its payload carries them.
type msgID struct {
	key int
	seq int
}

func (m msgID) payload() []byte { return fmt.Appendf(nil, "k%d:%d", m.key, m.seq) }
func keyBytes(k int) []byte     { return fmt.Appendf(nil, "key-%d", k) }
func parsePayload(p []byte) (msgID, bool) {
	var m msgID
	_, err := fmt.Sscanf(string(p), "k%d:%d", &m.key, &m.seq)
	return m, err == nil
}

func (r *runner) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.problems) < 50 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

func (r *runner) run() (Report, error) {
	cfg := r.cfg
	ctx := context.Background()
	rep := Report{Messages: cfg.Messages, Keys: cfg.Keys, Writers: cfg.Writers, Relays: cfg.Relays, BucketCount: cfg.BucketCount}

	r.faulty.Store(!cfg.Faults.None)
	r.slots = make([]*slotRelay, cfg.Relays)
	for i := range r.slots {
		if err := r.start(ctx, i); err != nil {
			r.stopAll()
			return Report{}, fmt.Errorf("chaos: start relay %d: %w", i, err)
		}
	}
	defer r.stopAll()

	start := time.Now()
	var writersDone time.Time
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.write(ctx, start)
		writersDone = time.Now()
	}()

	events := r.schedule(&rep)
	for _, ev := range events {
		time.Sleep(time.Until(start.Add(ev.at)))
		ev.do(ctx)
	}
	faultsEnd := time.Now()
	wg.Wait()
	rep.WriteTime = writersDone.Sub(start)
	rep.FaultTime = faultsEnd.Sub(start)

	// Drain: wait until every committed message was delivered once.
	drainFrom := faultsEnd
	if writersDone.After(drainFrom) {
		drainFrom = writersDone
	}
	want := len(r.committed)
	deadline := time.Now().Add(cfg.DrainTimeout)
	drained := false
	for time.Now().Before(deadline) {
		if r.deliveredCommitted() >= want {
			drained = true
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	rep.DrainTime = time.Since(drainFrom)
	if !drained {
		r.problem("backlog not drained within %s of the faults ending", cfg.DrainTimeout)
	}
	r.stopAll()
	r.check(ctx, &rep)
	return rep, nil
}

// deliveredCommitted counts committed messages delivered at least once.
func (r *runner) deliveredCommitted() int {
	// Unique is cheap; only look closer when it says enough arrived.
	if r.rec.Unique() < len(r.committed) {
		return r.rec.Unique()
	}
	seen := make(map[msgID]bool, len(r.committed))
	for _, env := range r.rec.Messages() {
		if m, ok := parsePayload(env.Payload); ok && r.committed[m] {
			seen[m] = true
		}
	}
	return len(seen)
}

type event struct {
	at time.Duration
	do func(ctx context.Context)
}

// schedule lays out the fault events over the fault phase and fills in the report's
// fault counts.
func (r *runner) schedule(rep *Report) []event {
	f := r.cfg.Faults
	d := f.Duration
	var evs []event
	frac := func(x float64) time.Duration { return time.Duration(float64(d) * x) }
	if f.ClockSetBack > 0 {
		rep.ClockSetBack = f.ClockSetBack
		evs = append(evs, event{frac(0.125), func(context.Context) { r.skew.Store(int64(f.ClockSetBack)) }})
	}
	if f.Outage > 0 {
		rep.Outage = f.Outage
		evs = append(evs,
			event{frac(0.25), func(context.Context) { r.down.Store(true) }},
			event{frac(0.25) + f.Outage, func(context.Context) { r.down.Store(false) }})
	}
	// Graceful stops share the window from 45% to 65% of the phase, round robin over
	// the slots starting at 1 (slot 0 carries the clock fault); each relay comes back
	// halfway to the next stop.
	if n := f.GracefulStops; n > 0 {
		gap := frac(0.2) / time.Duration(n)
		for k := range n {
			slot := (1 + k) % r.cfg.Relays
			at := frac(0.45) + time.Duration(k)*gap
			evs = append(evs,
				event{at, func(ctx context.Context) { r.stop(ctx, slot) }},
				event{at + gap/2, func(ctx context.Context) {
					if err := r.start(ctx, slot); err != nil {
						r.problem("restart relay %d: %v", slot, err)
					}
				}})
		}
		rep.GracefulStops = n
	}
	// Crashes share the window from 65% to 85%, from the last slot down; crashed
	// relays stay down until the faults end.
	if n := f.Crashes; n > 0 {
		gap := frac(0.2) / time.Duration(n)
		for k := range n {
			slot := r.cfg.Relays - 1 - k
			evs = append(evs, event{frac(0.65) + time.Duration(k)*gap, func(context.Context) { r.crash(slot) }})
		}
		rep.Crashes = n
	}
	evs = append(evs, event{d, func(ctx context.Context) {
		r.faulty.Store(false)
		r.down.Store(false)
		r.skew.Store(0)
		for slot := range r.cfg.Relays {
			r.mu.Lock()
			empty := r.slots[slot] == nil
			r.mu.Unlock()
			if empty {
				if err := r.start(ctx, slot); err != nil {
					r.problem("restart relay %d after the faults: %v", slot, err)
				}
			}
		}
	}})
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

// start runs a new dispatcher in slot under a new relay ID.
func (r *runner) start(ctx context.Context, slot int) error {
	r.mu.Lock()
	r.generation++
	gen := r.generation
	r.mu.Unlock()
	cfg := r.cfg
	ft, err := outboxtest.NewFaultTransport(r.rec, outboxtest.Faults{
		MessageErrorRate: cfg.Faults.MessageErrorRate,
		BatchErrorRate:   cfg.Faults.BatchErrorRate,
		Latency:          cfg.Faults.Latency,
		Jitter:           cfg.Faults.Jitter,
		Seed:             cfg.Seed*1000 + uint64(gen),
	})
	if err != nil {
		return err
	}
	dcfg := relay.Config{
		RelayID:            fmt.Sprintf("chaos-%d-g%d", slot, gen),
		BucketCount:        cfg.BucketCount,
		BatchSize:          cfg.BatchSize,
		PollInterval:       cfg.PollInterval,
		LeaseDuration:      cfg.LeaseDuration,
		LeaseRenewInterval: cfg.LeaseRenewInterval,
		StoreTimeout:       cfg.StoreTimeout,
		MaxAttempts:        cfg.MaxAttempts,
		BackoffBase:        cfg.BackoffBase,
		BackoffMax:         cfg.BackoffMax,
		Logger:             cfg.Logger.With("relay", slot, "generation", gen),
	}
	if slot == 0 {
		dcfg.Now = func() time.Time { return time.Now().Add(-time.Duration(r.skew.Load())) }
	}
	store, handle := r.store, outboxtest.Store(nil)
	if r.cfg.Reopen != nil {
		handle = r.cfg.Reopen(r.t, r.store)
		store = handle
	}
	closeHandle := func() {
		if handle != nil {
			_ = handle.Close()
		}
	}
	inflight := new(atomic.Int32)
	d, err := relay.New(store, &switchTransport{r: r, faulty: ft, inflight: inflight}, dcfg)
	if err != nil {
		closeHandle()
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	if err := d.Start(rctx); err != nil {
		cancel()
		closeHandle()
		return err
	}
	r.mu.Lock()
	r.slots[slot] = &slotRelay{d: d, cancel: cancel, inflight: inflight, handle: handle}
	r.transports = append(r.transports, ft)
	r.mu.Unlock()
	return nil
}

// take removes slot's relay, if any.
func (r *runner) take(slot int) *slotRelay {
	r.mu.Lock()
	defer r.mu.Unlock()
	rl := r.slots[slot]
	r.slots[slot] = nil
	return rl
}

// retire adds a stopped dispatcher's counters and reports if it had stopped on its own.
func (r *runner) retire(slot int, rl *slotRelay) {
	rl.cancel()
	if rl.handle != nil {
		_ = rl.handle.Close()
	}
	if err := rl.d.Err(); err != nil {
		r.problem("relay %d (%s) stopped on its own: %v", slot, rl.d.RelayID(), err)
	}
	s := rl.d.Stats()
	r.mu.Lock()
	r.stats.Rounds += s.Rounds
	r.stats.RefusedWrites += s.RefusedWrites
	r.stats.Published += s.Published
	r.stats.Retried += s.Retried
	r.stats.Parked += s.Parked
	r.stats.OutOfOrder += s.OutOfOrder
	r.mu.Unlock()
}

// stop stops slot's relay gracefully: it finishes in-flight batches and releases its
// leases.
func (r *runner) stop(ctx context.Context, slot int) {
	rl := r.take(slot)
	if rl == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := rl.d.Stop(sctx); err != nil {
		r.problem("graceful stop of relay %d: %v", slot, err)
	}
	r.retire(slot, rl)
}

// crash stops slot's relay as a killed process stops ([relay.Relay.Kill]):
// in-flight work is cancelled and the leases are left to lapse. It waits up to a
// second for the relay to be in the middle of a publish, so the crash lands where it
// costs the most.
func (r *runner) crash(slot int) {
	r.mu.Lock()
	rl := r.slots[slot]
	r.mu.Unlock()
	if rl == nil {
		return
	}
	for deadline := time.Now().Add(time.Second); rl.inflight.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Microsecond)
	}
	rl = r.take(slot)
	if rl == nil {
		return
	}
	rl.d.Kill() // the leases are abandoned
	r.retire(slot, rl)
}

func (r *runner) stopAll() {
	var wg sync.WaitGroup
	for slot := range r.cfg.Relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.stop(context.Background(), slot)
		}()
	}
	wg.Wait()
}

// switchTransport sends through the fault injector while faults are on, and straight
// to the recorder once they end.
//
// A batch in flight when its relay crashes still reaches the broker, as bytes already
// on the wire would, but the relay never hears the acknowledgement: it is published
// and not completed, so the bucket's next owner publishes it again. That is the
// duplicate a real crash between publish and complete makes.
type switchTransport struct {
	r        *runner
	faulty   *outboxtest.FaultTransport
	inflight *atomic.Int32
}

func (s *switchTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.r.down.Load() {
		s.r.refusedInOutage.Add(1)
		return outboxtest.ErrOutage
	}
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	var err error
	if s.r.faulty.Load() {
		err = s.faulty.Publish(context.WithoutCancel(ctx), batch)
	} else {
		err = s.r.rec.Publish(context.WithoutCancel(ctx), batch)
	}
	if ctx.Err() != nil {
		return ctx.Err() // the relay died before the acknowledgement arrived
	}
	return err
}

// write runs the writers and fills committed and rolledBack.
func (r *runner) write(ctx context.Context, start time.Time) {
	cfg := r.cfg
	type result struct {
		committed, rolledBack []msgID
	}
	results := make([]result, cfg.Writers)
	sender, err := outbox.NewSender(r.store, outbox.SenderConfig{Mode: outbox.Transactional, Logger: cfg.Logger})
	if err != nil {
		r.problem("capture: %v", err)
		return
	}
	var wg sync.WaitGroup
	for w := range cfg.Writers {
		quota := cfg.Messages / cfg.Writers
		if w < cfg.Messages%cfg.Writers {
			quota++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(w)+1))
			var keys []int
			for k := w; k < cfg.Keys; k += cfg.Writers {
				keys = append(keys, k)
			}
			seq := make(map[int]int, len(keys))
			// Spread the units over most of the fault phase, so faults meet traffic.
			units := max(1, quota*2/(cfg.UnitSize+1))
			pace := time.Duration(float64(cfg.Faults.Duration) * 0.8 / float64(units))
			res := &results[w]
			for u, left := 0, quota; left > 0; u++ {
				time.Sleep(time.Until(start.Add(time.Duration(u) * pace)))
				n := min(left, 1+rng.IntN(cfg.UnitSize))
				left -= n
				ids := make([]msgID, n)
				for i := range ids {
					k := keys[rng.IntN(len(keys))]
					seq[k]++
					ids[i] = msgID{key: k, seq: seq[k]}
				}
				rollback := rng.Float64() < cfg.RollbackShare
				err := r.h.Transact(ctx, r.store, func(ctx context.Context) error {
					for _, id := range ids {
						msg := outbox.Message{Topic: Topic, Key: keyBytes(id.key), Payload: id.payload()}
						if err := sender.Send(ctx, msg); err != nil {
							return err
						}
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				switch {
				case err == nil:
					res.committed = append(res.committed, ids...)
				case errors.Is(err, errRollback):
					res.rolledBack = append(res.rolledBack, ids...)
				default:
					// The outcome is unknown: the run cannot judge these messages.
					r.problem("writer %d: unit of work failed: %v", w, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	r.committed = make(map[msgID]bool, cfg.Messages)
	r.rolledBack = make(map[msgID]bool)
	for _, res := range results {
		for _, id := range res.committed {
			r.committed[id] = true
		}
		for _, id := range res.rolledBack {
			r.rolledBack[id] = true
		}
	}
}
