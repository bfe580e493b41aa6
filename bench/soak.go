package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// soakWindow is one window (a minute in the full run) of the soak.
type soakWindow struct {
	Index              int
	Messages           int // committed in the window
	P99                time.Duration
	TotalBytes         int64 // pg_total_relation_size, summed over partitions if any
	IndexBytes         int64 // pg_indexes_size, likewise
	DeadTuples         int64
	Autovacuums        int64 // runs during the window
	Pending            int64 // committed but not yet received at the window's end
	SlotLag            int64 // log mode: WAL bytes the slot's reader had not confirmed at the window's end; -1 in table mode
	ReceivedInWindow   int
	receivedCumulative int
}

type soakResult struct {
	Contender  string
	Rate       float64 // the writers' target, msg/s
	RateSource string
	Achieved   float64
	MsgsPerTx  int
	Relays     int
	For        time.Duration
	Window     time.Duration
	Windows    []soakWindow
	Checks     checks
}

// LatencyHeld reports whether every window's p99 stayed within 2× the first's.
func (r *soakResult) LatencyHeld() bool {
	if len(r.Windows) == 0 {
		return false
	}
	first := r.Windows[0].P99
	for _, w := range r.Windows {
		if w.P99 > 2*first {
			return false
		}
	}
	return true
}

// SizeSettled reports whether the table stopped growing: its largest size in the
// second half of the soak is at most 10 % above its largest in the first half.
func (r *soakResult) SizeSettled() bool {
	n := len(r.Windows)
	if n < 2 {
		return false
	}
	var first, second int64
	for i, w := range r.Windows {
		if i < n/2 {
			first = max(first, w.TotalBytes)
		} else {
			second = max(second, w.TotalBytes)
		}
	}
	return float64(second) <= 1.1*float64(first)
}

// LagBounded reports, for the log mode, whether the slot's lag stayed bounded: its
// largest value in the second half of the soak is at most 2× its largest in the
// first half, or under 16 MiB.
func (r *soakResult) LagBounded() bool {
	n := len(r.Windows)
	if n < 2 {
		return false
	}
	var first, second int64
	for i, w := range r.Windows {
		if i < n/2 {
			first = max(first, w.SlotLag)
		} else {
			second = max(second, w.SlotLag)
		}
	}
	return second < 16<<20 || second <= 2*first
}

// Logged reports whether the soak ran in log mode.
func (r *soakResult) Logged() bool { return r.Contender == outboxLog.name }

// soakTxRate caps the writers' transactions per second: above it, a transaction
// carries several messages.
const soakTxRate = 500

func soakScenario(ctx context.Context, e *env, c contender, rate float64, source string, relays int, dur, window time.Duration) (*soakResult, error) {
	perTx := max(1, int(math.Ceil(rate/soakTxRate)))
	res := &soakResult{Contender: c.name, Rate: rate, RateSource: source, MsgsPerTx: perTx, Relays: relays, For: dur, Window: window}
	s, err := open(ctx, e, c)
	if err != nil {
		return nil, err
	}
	defer s.close(ctx)
	if err := s.startRelays(ctx, relays, 100); err != nil {
		return nil, err
	}
	if err := s.waitReady(ctx, driver.DefaultBucketCount, 30*time.Second); err != nil {
		return nil, err
	}
	p := newPlan(latencyWriters)
	col, err := s.run.broker.collect(p, true)
	if err != nil {
		return nil, err
	}
	say("soak | %s | %.0f msg/s (%s), %d messages per transaction, %d relays, %v in windows of %v", c.name, rate, source, perTx, relays, dur, window)

	start := time.Now()
	windows := max(1, int(dur/window))
	var wg sync.WaitGroup
	wg.Go(func() { res.Windows = sampleSoak(ctx, e, s, p, col, start, window, windows) })
	committed, werr := steadyWriters(ctx, s, p, rate, perTx, start.Add(time.Duration(windows)*window))
	elapsed := time.Since(start)
	wg.Wait()
	res.Achieved = float64(p.total()) / elapsed.Seconds()
	ch, err := s.settle(ctx, col, p.total())
	res.Checks.add(ch)
	if werr != nil {
		return res, werr
	}
	if err != nil {
		return res, err
	}
	first := start.UnixNano()
	byWindow := latencies(p, col, committed, len(res.Windows), func(at int64) int { return int((at - first) / int64(window)) })
	for i, lat := range byWindow {
		res.Windows[i].Messages = len(lat)
		res.Windows[i].P99 = percentile(lat, 0.99)
	}
	return res, nil
}

// soakCapacity measures what the machine sustains with writers and relays running
// together: the soak's writers commit as fast as they can, soakProbeMsgsPerTx
// messages per transaction, while the relays run, for probe; the capacity is the
// rate the consumer received over the probe's second half.
func soakCapacity(ctx context.Context, e *env, relays int, probe time.Duration) (float64, error) {
	s, err := open(ctx, e, outboxPG)
	if err != nil {
		return 0, err
	}
	defer s.close(ctx)
	if err := s.startRelays(ctx, relays, 100); err != nil {
		return 0, err
	}
	if err := s.waitReady(ctx, driver.DefaultBucketCount, 30*time.Second); err != nil {
		return 0, err
	}
	p := newPlan(latencyWriters)
	col, err := s.run.broker.collect(p, true)
	if err != nil {
		return 0, err
	}
	received := func() int {
		col.mu.Lock()
		defer col.mu.Unlock()
		return col.distinct
	}
	until := time.Now().Add(probe)
	var order atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, p.writers)
	for w := range p.writers {
		wg.Go(func() {
			for time.Now().Before(until) && ctx.Err() == nil {
				if _, err := s.in.write(ctx, order.Add(1), p.next(w, soakProbeMsgsPerTx)); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	time.Sleep(probe / 2)
	from, at := received(), time.Now()
	wg.Wait()
	rate := float64(received()-from) / time.Since(at).Seconds()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	_, err = s.settle(ctx, col, p.total())
	return rate, err
}

// soakProbeMsgsPerTx is how many messages a transaction of soakCapacity carries.
const soakProbeMsgsPerTx = 100

// soakRelations are the outbox table and, if it is partitioned, its partitions.
const soakRelations = `SELECT $1::regclass AS relid UNION SELECT relid FROM pg_partition_tree($1::regclass)`

// sampleSoak reads the outbox table's size and vacuum statistics at the end of
// every window.
func sampleSoak(ctx context.Context, e *env, s *session, p *plan, col *collector, start time.Time, window time.Duration, windows int) []soakWindow {
	var out []soakWindow
	var lastAutovacuums int64 = -1
	table := s.in.queue()
	for i := range windows {
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * window)))
		w := soakWindow{Index: i + 1, SlotLag: -1}
		err := e.pg.QueryRow(ctx, `SELECT COALESCE(sum(pg_total_relation_size(relid)), 0), COALESCE(sum(pg_indexes_size(relid)), 0)
			FROM (`+soakRelations+`) t`, table).Scan(&w.TotalBytes, &w.IndexBytes)
		if err == nil {
			var autovacuums int64
			err = e.pg.QueryRow(ctx, `SELECT COALESCE(sum(n_dead_tup), 0), COALESCE(sum(autovacuum_count), 0)
				FROM pg_stat_user_tables WHERE relid IN (`+soakRelations+`)`, table).Scan(&w.DeadTuples, &autovacuums)
			if lastAutovacuums >= 0 {
				w.Autovacuums = autovacuums - lastAutovacuums
			} else {
				w.Autovacuums = autovacuums
			}
			lastAutovacuums = autovacuums
		}
		if st, ok := s.in.(streamingInstance); ok && err == nil {
			w.SlotLag, err = st.lag(ctx)
		}
		if err != nil {
			say("  soak statistics: %v", err)
		}
		col.mu.Lock()
		w.receivedCumulative = col.distinct
		col.mu.Unlock()
		w.Pending = int64(p.total() - w.receivedCumulative)
		prev := 0
		if len(out) > 0 {
			prev = out[len(out)-1].receivedCumulative
		}
		w.ReceivedInWindow = w.receivedCumulative - prev
		say("soak | window %d | %s total, %s indexes, %d dead tuples, %d autovacuums, %d pending, %d received, slot lag %d bytes",
			w.Index, bytesText(w.TotalBytes), bytesText(w.IndexBytes), w.DeadTuples, w.Autovacuums, w.Pending, w.ReceivedInWindow, w.SlotLag)
		out = append(out, w)
	}
	return out
}

func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n/1024)
	}
}
