package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxkit/outbox/driver"
)

type drainConfig struct {
	Backlog, Batch, Relays int
	// Stopped: the backlog is written while no relay runs, and the clock runs from
	// the relays' start (connecting, taking leases and the stream included).
	Stopped bool
}

func (d drainConfig) String() string {
	s := fmt.Sprintf("%s backlog, batch %d, %d relay%s", kilo(float64(d.Backlog)), d.Batch, d.Relays, plural(d.Relays))
	if d.Stopped {
		s += ", written while stopped"
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

type drainResult struct {
	Contenders []string
	Configs    []drainConfig
	Rate       map[string][]float64 // config/contender → msg/s per repetition
	CPU        map[string][]float64 // config/contender → share of the machine's CPU busy while draining
	Checks     map[string]*checks
}

func dkey(d drainConfig, contender string) string { return d.String() + "/" + contender }

// drainConfigs: both batch sizes with 1 and 2 relays on the small backlog, and with
// 1 relay on the small backlog written while the relay is stopped; the large one with
// 1 relay, to compare with the small.
func drainConfigs(sz sizes) []drainConfig {
	var out []drainConfig
	for _, batch := range []int{100, 500} {
		for _, relays := range []int{1, 2} {
			out = append(out, drainConfig{Backlog: sz.backlog, Batch: batch, Relays: relays})
		}
	}
	for _, batch := range []int{100, 500} {
		out = append(out, drainConfig{Backlog: sz.backlog, Batch: batch, Relays: 1, Stopped: true})
	}
	if sz.largeBacklog > 0 {
		for _, batch := range []int{100, 500} {
			out = append(out, drainConfig{Backlog: sz.largeBacklog, Batch: batch, Relays: 1})
		}
	}
	return out
}

func drainScenario(ctx context.Context, e *env, contenders []contender, sz sizes, reps int) (*drainResult, error) {
	res := &drainResult{Configs: drainConfigs(sz), Rate: map[string][]float64{}, CPU: map[string][]float64{}, Checks: map[string]*checks{}}
	for _, c := range contenders {
		res.Contenders = append(res.Contenders, c.name)
		res.Checks[c.name] = &checks{}
	}
	for _, cfg := range res.Configs {
		for rep := range reps {
			for _, c := range contenders {
				rate, cpu, ch, err := drainOne(ctx, e, c, cfg)
				res.Checks[c.name].add(ch)
				if err != nil {
					return nil, fmt.Errorf("drain %s, %s, rep %d: %w", cfg, c.name, rep+1, err)
				}
				k := dkey(cfg, c.name)
				res.Rate[k] = append(res.Rate[k], rate)
				res.CPU[k] = append(res.CPU[k], cpu)
				say("drain | %-52s | rep %d | %-10s | %8.0f msg/s | CPU %3.0f %% | dup %d, reordered %d", cfg, rep+1, c.name, rate, 100*cpu, ch.Duplicates, ch.Reordered)
			}
		}
	}
	return res, nil
}

// drainOne starts the relays on an empty queue and waits until they share the
// work, as a running fleet does; then the whole backlog arrives in one
// transaction, and the clock runs from its commit until the consumer has read
// every message. With cfg.Stopped the backlog is committed first, and the clock
// runs from the relays' start.
func drainOne(ctx context.Context, e *env, c contender, cfg drainConfig) (rate, cpu float64, _ check, _ error) {
	s, err := open(ctx, e, c)
	if err != nil {
		return 0, 0, check{}, err
	}
	defer s.close(ctx)
	p := newPlan(1)
	col, err := s.run.broker.collect(p, false)
	if err != nil {
		return 0, 0, check{}, err
	}
	var start time.Time
	var meter cpuMeter
	if cfg.Stopped {
		if _, _, err := fillOnce(ctx, e, s, p, cfg.Backlog); err != nil {
			return 0, 0, check{}, errors.Join(fmt.Errorf("fill: %w", err), col.finish(ctx))
		}
		start, meter = time.Now(), startCPU()
		if err := s.startRelays(ctx, cfg.Relays, cfg.Batch); err != nil {
			return 0, 0, check{}, errors.Join(err, col.finish(ctx))
		}
	} else {
		if err := s.startRelays(ctx, cfg.Relays, cfg.Batch); err != nil {
			return 0, 0, check{}, errors.Join(err, col.finish(ctx))
		}
		if err := s.waitReady(ctx, driver.DefaultBucketCount, 30*time.Second); err != nil {
			return 0, 0, check{}, errors.Join(err, col.finish(ctx))
		}
		if start, meter, err = fillOnce(ctx, e, s, p, cfg.Backlog); err != nil {
			return 0, 0, check{}, errors.Join(fmt.Errorf("fill: %w", err), col.finish(ctx))
		}
	}
	if err := col.waitFor(cfg.Backlog, time.Minute+time.Duration(cfg.Backlog)*time.Millisecond); err != nil {
		say("  %v", err)
	}
	cpu = meter.share()
	ch, err := s.settle(ctx, col, cfg.Backlog)
	if err != nil {
		return 0, 0, ch, err
	}
	return float64(cfg.Backlog) / col.lastFirstReceipt().Sub(start).Seconds(), cpu, ch, nil
}

// fillOnce writes n messages in one transaction and returns when its commit began,
// and a CPU meter started then.
func fillOnce(ctx context.Context, e *env, s *session, p *plan, n int) (time.Time, cpuMeter, error) {
	tx, err := e.pg.Begin(ctx)
	if err != nil {
		return time.Time{}, cpuMeter{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var committed []func()
	for left := n; left > 0; {
		k := min(left, 10_000)
		after, err := s.in.fill(ctx, tx, p.next(0, k))
		if err != nil {
			return time.Time{}, cpuMeter{}, err
		}
		if after != nil {
			committed = append(committed, after)
		}
		left -= k
	}
	// ANALYZE in the same transaction samples the backlog it wrote, and its
	// statistics commit with it: the relays' queries are planned for the table as it
	// is when they first see it (a stale "empty table" plan sends Watermill's
	// subscriber to scanning the whole table for every batch).
	if _, err := tx.Exec(ctx, "ANALYZE "+s.in.queue()); err != nil {
		return time.Time{}, cpuMeter{}, err
	}
	start, meter := time.Now(), startCPU()
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, cpuMeter{}, err
	}
	for _, after := range committed {
		after()
	}
	return start, meter, nil
}
