package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// latencyWriters share the steady rate, each on its own ticker, offset from the others.
const latencyWriters = 4

type latencyStats struct {
	P50, P99, Max time.Duration
	Rate          float64 // messages per second the writers achieved
}

type latencyResult struct {
	Contenders []string
	Batches    []int
	Rate       int
	For        time.Duration
	Stats      map[string][]latencyStats // batch/contender → per repetition
	Checks     map[string]*checks
}

func lkey(batch int, contender string) string { return fmt.Sprintf("batch %d/%s", batch, contender) }

func latencyScenario(ctx context.Context, e *env, contenders []contender, sz sizes, reps int) (*latencyResult, error) {
	res := &latencyResult{Batches: []int{100, 500}, Rate: sz.latencyRate, For: sz.latencyFor,
		Stats: map[string][]latencyStats{}, Checks: map[string]*checks{}}
	for _, c := range contenders {
		res.Contenders = append(res.Contenders, c.name)
		res.Checks[c.name] = &checks{}
	}
	for _, batch := range res.Batches {
		for rep := range reps {
			for _, c := range contenders {
				st, ch, err := latencyOne(ctx, e, c, batch, sz.latencyRate, sz.latencyFor)
				res.Checks[c.name].add(ch)
				if err != nil {
					return nil, fmt.Errorf("latency batch %d, %s, rep %d: %w", batch, c.name, rep+1, err)
				}
				k := lkey(batch, c.name)
				res.Stats[k] = append(res.Stats[k], st)
				say("latency | batch %3d | rep %d | %-10s | p50 %6.2f ms  p99 %6.2f ms  max %7.2f ms | %.0f msg/s", batch, rep+1, c.name, ms(st.P50), ms(st.P99), ms(st.Max), st.Rate)
			}
		}
	}
	return res, nil
}

// steadyWriters commit msgsPerTx messages per transaction at rate messages per
// second over latencyWriters goroutines until the deadline, and return each writer's
// commit-return times, by message (in the order the writer took its ids).
func steadyWriters(ctx context.Context, s *session, p *plan, rate float64, msgsPerTx int, until time.Time) ([][]int64, error) {
	writers := p.writers
	period := time.Duration(float64(time.Second) * float64(writers*msgsPerTx) / rate)
	committed := make([][]int64, writers)
	errs := make([]error, writers)
	var order atomic.Int64
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			// Offset each writer by its share of the period, so commits spread evenly.
			time.Sleep(time.Duration(w) * period / time.Duration(writers))
			tick := time.NewTicker(period)
			defer tick.Stop()
			for time.Now().Before(until) {
				msgs := p.next(w, msgsPerTx)
				at, err := s.in.write(ctx, order.Add(1), msgs)
				if err != nil {
					errs[w] = err
					return
				}
				for range msgs {
					committed[w] = append(committed[w], at.UnixNano())
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return committed, err
		}
	}
	return committed, nil
}

// latencies pairs each message's commit-return time with its first receipt, sorted
// into groups: group says which a commit time belongs to (-1: none).
func latencies(p *plan, col *collector, committed [][]int64, groups int, group func(commit int64) int) [][]time.Duration {
	out := make([][]time.Duration, groups)
	col.mu.Lock()
	defer col.mu.Unlock()
	for w, times := range committed {
		for k, at := range times {
			g := group(at)
			id := p.id(w, k)
			if g < 0 || g >= groups || id >= uint64(len(col.firstAt)) || col.firstAt[id] == 0 {
				continue // a missing message is counted by the delivery check
			}
			out[g] = append(out[g], time.Duration(max(0, col.firstAt[id]-at)))
		}
	}
	for _, lat := range out {
		slices.Sort(lat)
	}
	return out
}

func latencyOne(ctx context.Context, e *env, c contender, batch, rate int, dur time.Duration) (latencyStats, check, error) {
	s, err := open(ctx, e, c)
	if err != nil {
		return latencyStats{}, check{}, err
	}
	defer s.close(ctx)
	if err := s.startRelays(ctx, 1, batch); err != nil {
		return latencyStats{}, check{}, err
	}
	if err := s.waitReady(ctx, driver.DefaultBucketCount, 30*time.Second); err != nil {
		return latencyStats{}, check{}, err
	}
	p := newPlan(latencyWriters)
	col, err := s.run.broker.collect(p, false)
	if err != nil {
		return latencyStats{}, check{}, err
	}
	start := time.Now()
	committed, werr := steadyWriters(ctx, s, p, float64(rate), 1, start.Add(dur))
	elapsed := time.Since(start)
	ch, err := s.settle(ctx, col, p.total())
	if werr != nil {
		return latencyStats{}, ch, werr
	}
	if err != nil {
		return latencyStats{}, ch, err
	}
	lat := latencies(p, col, committed, 1, func(int64) int { return 0 })[0]
	return latencyStats{P50: percentile(lat, 0.50), P99: percentile(lat, 0.99), Max: percentile(lat, 1),
		Rate: float64(p.total()) / elapsed.Seconds()}, ch, nil
}
