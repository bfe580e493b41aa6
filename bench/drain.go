package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

type drainConfig struct {
	Backlog, Batch, Relays int
}

func (d drainConfig) String() string {
	return fmt.Sprintf("%s backlog, batch %d, %d relay%s", kilo(float64(d.Backlog)), d.Batch, d.Relays, plural(d.Relays))
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
	Checks     map[string]*checks
}

func dkey(d drainConfig, contender string) string { return d.String() + "/" + contender }

// drainConfigs: both batch sizes with 1 and 2 relays on the small backlog; the
// large one with 1 relay, to compare with the small.
func drainConfigs(sz sizes) []drainConfig {
	var out []drainConfig
	for _, batch := range []int{100, 500} {
		for _, relays := range []int{1, 2} {
			out = append(out, drainConfig{Backlog: sz.backlog, Batch: batch, Relays: relays})
		}
	}
	if sz.largeBacklog > 0 {
		for _, batch := range []int{100, 500} {
			out = append(out, drainConfig{Backlog: sz.largeBacklog, Batch: batch, Relays: 1})
		}
	}
	return out
}

func drainScenario(ctx context.Context, e *env, contenders []contender, sz sizes, reps int) (*drainResult, error) {
	res := &drainResult{Configs: drainConfigs(sz), Rate: map[string][]float64{}, Checks: map[string]*checks{}}
	for _, c := range contenders {
		res.Contenders = append(res.Contenders, c.name)
		res.Checks[c.name] = &checks{}
	}
	for _, cfg := range res.Configs {
		for rep := range reps {
			for _, c := range contenders {
				rate, ch, err := drainOne(ctx, e, c, cfg)
				res.Checks[c.name].add(ch)
				if err != nil {
					return nil, fmt.Errorf("drain %s, %s, rep %d: %w", cfg, c.name, rep+1, err)
				}
				k := dkey(cfg, c.name)
				res.Rate[k] = append(res.Rate[k], rate)
				say("drain | %-30s | rep %d | %-10s | %8.0f msg/s | dup %d, reordered %d", cfg, rep+1, c.name, rate, ch.Duplicates, ch.Reordered)
			}
		}
	}
	return res, nil
}

// drainOne fills a backlog, then times its relays from their start until the
// consumer has read every message.
func drainOne(ctx context.Context, e *env, c contender, cfg drainConfig) (float64, check, error) {
	s, err := open(ctx, e, c)
	if err != nil {
		return 0, check{}, err
	}
	defer s.close(ctx)
	p := newPlan(1)
	for left := cfg.Backlog; left > 0; {
		n := min(left, 10_000)
		if err := s.in.fill(ctx, p.next(0, n)); err != nil {
			return 0, check{}, fmt.Errorf("fill: %w", err)
		}
		left -= n
	}
	if _, err := e.pg.Exec(ctx, "VACUUM ANALYZE "+s.in.queue()); err != nil {
		return 0, check{}, err
	}
	col, err := s.run.broker.collect(p, false)
	if err != nil {
		return 0, check{}, err
	}
	start := time.Now()
	if err := s.startRelays(ctx, cfg.Relays, cfg.Batch); err != nil {
		return 0, check{}, errors.Join(err, col.finish(ctx))
	}
	ch, err := s.settle(ctx, col, cfg.Backlog)
	if err != nil {
		return 0, ch, err
	}
	return float64(cfg.Backlog) / col.lastFirstReceipt().Sub(start).Seconds(), ch, nil
}
