package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Report is what a run did and what the checker found.
type Report struct {
	// The run's size.
	Messages, Keys, Writers, Relays, BucketCount int

	// Committed and RolledBack count the messages of committed and deliberately
	// rolled back units of work.
	Committed, RolledBack int
	// Deliveries counts every message the broker received, duplicates included.
	Deliveries int
	// Duplicates counts deliveries of a message that had been delivered before.
	Duplicates int

	// Faults injected.
	InjectedErrors int           // transient message and batch failures, outage refusals included
	Outage         time.Duration // length of the broker outage
	GracefulStops  int
	Crashes        int
	ClockSetBack   time.Duration // how far relay 0's clock was set back

	// Dispatcher counters, summed over every relay of the run.
	Retried, Parked, RefusedWrites int64

	// WriteTime is how long the writers took; FaultTime the fault phase.
	WriteTime, FaultTime time.Duration
	// DrainTime is how long after the faults ended and the writers finished every
	// committed message had been delivered once.
	DrainTime time.Duration

	// Violations of the guarantees.
	Missing    int // committed, never delivered
	Unexpected int // rolled back (or never written), yet delivered
	OutOfOrder int // first deliveries that came before an earlier commit of their key
	Leftover   int // pending or parked messages still in the store after the drain
	// Problems describes the violations and anything else that went wrong, the first
	// fifty.
	Problems []string
}

// Err returns an error describing the broken guarantees, or nil.
func (r Report) Err() error {
	if len(r.Problems) == 0 && r.Missing == 0 && r.Unexpected == 0 && r.OutOfOrder == 0 && r.Leftover == 0 {
		return nil
	}
	return fmt.Errorf("chaos: guarantees broken: missing %d, unexpected %d, out of order %d, left over %d:\n  %s",
		r.Missing, r.Unexpected, r.OutOfOrder, r.Leftover, strings.Join(r.Problems, "\n  "))
}

// String is a short, readable summary.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "messages %d (committed %d, rolled back %d), keys %d, writers %d, relays %d, buckets %d\n",
		r.Messages, r.Committed, r.RolledBack, r.Keys, r.Writers, r.Relays, r.BucketCount)
	fmt.Fprintf(&b, "faults: %d injected errors, outage %s, %d graceful stops, %d crashes, clock set back %s\n",
		r.InjectedErrors, r.Outage, r.GracefulStops, r.Crashes, r.ClockSetBack)
	fmt.Fprintf(&b, "dispatchers: %d retried, %d parked, %d refused lease writes\n", r.Retried, r.Parked, r.RefusedWrites)
	fmt.Fprintf(&b, "deliveries %d, duplicates %d; writes took %s, faults %s, drain after faults %s\n",
		r.Deliveries, r.Duplicates, r.WriteTime.Round(time.Millisecond), r.FaultTime.Round(time.Millisecond), r.DrainTime.Round(time.Millisecond))
	fmt.Fprintf(&b, "violations: missing %d, unexpected %d, out of order %d, left over %d", r.Missing, r.Unexpected, r.OutOfOrder, r.Leftover)
	for _, p := range r.Problems {
		fmt.Fprintf(&b, "\n  %s", p)
	}
	return b.String()
}

// check compares what the broker received with what was committed.
func (r *runner) check(ctx context.Context, rep *Report) {
	rep.Committed = len(r.committed)
	rep.RolledBack = len(r.rolledBack)
	rep.InjectedErrors = int(r.refusedInOutage.Load())
	for _, ft := range r.transports {
		rep.InjectedErrors += ft.Injected()
	}
	rep.Retried, rep.Parked, rep.RefusedWrites = r.stats.Retried, r.stats.Parked, r.stats.RefusedWrites

	delivered := make(map[msgID]int, len(r.committed))
	lastFirst := make(map[int]int) // key -> seq of its latest first delivery
	for _, env := range r.rec.Messages() {
		rep.Deliveries++
		m, ok := parsePayload(env.Payload)
		if !ok || string(env.Key) != string(keyBytes(m.key)) {
			rep.Unexpected++
			r.problem("delivered a message the writers never sent: key %q payload %q", env.Key, env.Payload)
			continue
		}
		delivered[m]++
		if delivered[m] > 1 {
			rep.Duplicates++
			continue
		}
		if !r.committed[m] {
			rep.Unexpected++
			if r.rolledBack[m] {
				r.problem("delivered rolled back message %s", m)
			} else {
				r.problem("delivered message %s that no unit of work committed", m)
			}
			continue
		}
		if m.seq <= lastFirst[m.key] {
			rep.OutOfOrder++
			r.problem("key %d: first delivery of seq %d after seq %d", m.key, m.seq, lastFirst[m.key])
		}
		lastFirst[m.key] = max(lastFirst[m.key], m.seq)
	}
	for m := range r.committed {
		if delivered[m] == 0 {
			rep.Missing++
			if rep.Missing <= 10 {
				r.problem("committed message %s never delivered", m)
			}
		}
	}

	// Nothing may stay behind: every bucket empty, nothing parked.
	store := r.store.Driver()
	for b := range r.cfg.BucketCount {
		batch, err := store.Fetch(ctx, b, 100)
		if err != nil {
			r.problem("fetch bucket %d after the drain: %v", b, err)
			continue
		}
		rep.Leftover += len(batch.Envelopes)
	}
	if admin, ok := store.(driver.Admin); ok {
		parked, err := admin.List(ctx, driver.Parked, driver.Cursor{}, 100)
		if err != nil && !errors.Is(err, outbox.ErrClosed) {
			r.problem("list parked after the drain: %v", err)
		}
		rep.Leftover += len(parked)
	}
	if rep.Leftover > 0 {
		r.problem("%d messages still pending or parked after the drain", rep.Leftover)
	}
	r.mu.Lock()
	rep.Problems = append([]string(nil), r.problems...)
	r.mu.Unlock()
}

func (m msgID) String() string { return fmt.Sprintf("key %d seq %d", m.key, m.seq) }
