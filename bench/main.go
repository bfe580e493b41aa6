// Command bench measures the outbox side by side with a hand-written SKIP LOCKED
// relay and Watermill's SQL forwarder, against one PostgreSQL (and MariaDB for the
// write cost) and an in-process Kafka: the cost of the in-transaction write, the
// drain of a backlog, the commit-to-consumer latency and a soak. Runs of the
// contenders interleave, the median of the repetitions is reported, and after every
// run a consumer checks that every message arrived exactly as sent.
//
//	go run ./bench                       # the full run (about half an hour)
//	go run ./bench -quick                # a smoke check in seconds
//	go run ./bench -only drain -reps 1   # one scenario
//	go run ./bench -out docs/benchmarks.md -images docs/images
//
// It prints a Markdown report to stdout and progress to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

var scenarioNames = []string{"write", "drain", "latency", "soak"}

type options struct {
	quick      bool
	reps       int
	only       []string
	large      bool
	soak       time.Duration
	soakRate   float64
	soakRelays int
	postgres   string
	out        string
	images     string
	command    string
	resize     func(*sizes) // tests shrink the quick sizes further
}

func (o options) runs(scenario string) bool {
	if len(o.only) == 0 {
		return scenario != "soak" || o.soak > 0
	}
	return slices.Contains(o.only, scenario)
}

// full is the default command: every scenario at its real size.
func (o options) full() bool { return !o.quick && len(o.only) == 0 }

func (o options) mode() string {
	switch {
	case o.quick:
		return "quick"
	case o.full():
		return "full"
	default:
		return "partial"
	}
}

// sizes are a mode's run sizes.
type sizes struct {
	writeTx      int // transactions per repetition, 1 writer
	writeTxEach  int // per writer, 8 writers
	backlog      int
	largeBacklog int // 0: not run
	latencyRate  int // messages per second
	latencyFor   time.Duration
	soakFor      time.Duration
	soakWindow   time.Duration
	soakProbe    time.Duration // how long soakCapacity measures
}

func (o options) sizes() sizes {
	sz := sizes{writeTx: 2000, writeTxEach: 500, backlog: 20_000, latencyRate: 300, latencyFor: 20 * time.Second,
		soakFor: o.soak, soakWindow: time.Minute, soakProbe: 20 * time.Second}
	if o.large || o.full() {
		sz.largeBacklog = 200_000
	}
	if o.quick {
		sz.writeTx, sz.writeTxEach, sz.backlog, sz.latencyFor = 40, 10, 200, 2*time.Second
		if sz.largeBacklog > 0 {
			sz.largeBacklog = 2000
		}
		sz.soakWindow, sz.soakProbe = time.Second, 2*time.Second
		if sz.soakFor == 0 || sz.soakFor > 5*time.Second {
			sz.soakFor = 3 * time.Second
		}
	}
	if o.resize != nil {
		o.resize(&sz)
	}
	return sz
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o options
	var only string
	fs.BoolVar(&o.quick, "quick", false, "tiny sizes: a smoke check that runs in seconds (its figures mean nothing)")
	fs.IntVar(&o.reps, "reps", 0, "repetitions of every run; the median is reported (default 3, 1 with -quick)")
	fs.StringVar(&only, "only", "", "comma-separated scenarios to run: "+strings.Join(scenarioNames, ","))
	fs.BoolVar(&o.large, "large", false, "also drain a 200k backlog (always in the full run)")
	fs.DurationVar(&o.soak, "soak", 0, "soak duration (10m in the full run or with -only soak; off otherwise)")
	fs.Float64Var(&o.soakRate, "soak-rate", 0, "the soak writers' rate in msg/s (default 70% of what writers and relays sustain together, or of the drain rate if lower)")
	fs.IntVar(&o.soakRelays, "soak-relays", 2, "relays running during the soak")
	fs.StringVar(&o.postgres, "postgres", "", "run the PostgreSQL scenarios on this server (it needs wal_level=logical and a user with REPLICATION) instead of a cluster the bench starts")
	fs.StringVar(&o.out, "out", "", "replace the report between the markers of this Markdown file")
	fs.StringVar(&o.images, "images", "", "write the SVG charts (bench-*.svg) into this directory")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for _, s := range strings.Split(only, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(scenarioNames, s) {
			return o, fmt.Errorf("-only: unknown scenario %q (want %s)", s, strings.Join(scenarioNames, ","))
		}
		o.only = append(o.only, s)
	}
	if o.reps == 0 {
		o.reps = 3
		if o.quick {
			o.reps = 1
		}
	}
	if o.reps < 1 || o.soakRelays < 1 {
		return o, errors.New("-reps and -soak-relays must be at least 1")
	}
	if o.soak == 0 && (o.full() || slices.Contains(o.only, "soak")) {
		o.soak = 10 * time.Minute
	}
	if o.quick && o.soak == 0 && len(o.only) == 0 {
		o.soak = 3 * time.Second // the smoke check covers the soak's code too
	}
	o.command = strings.TrimSpace("go run ./bench " + strings.Join(args, " "))
	return o, nil
}

func main() {
	opts, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rep, err := runAll(ctx, opts, false)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if err := publish(rep, opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// publish prints the report and writes the charts and the docs page.
func publish(rep *report, opts options) error {
	if opts.images != "" {
		rep.Charts = filepath.ToSlash(opts.images)
		if opts.out != "" {
			if rel, err := filepath.Rel(filepath.Dir(opts.out), opts.images); err == nil {
				rep.Charts = filepath.ToSlash(rel)
			}
		}
		if err := writeCharts(rep, opts.images); err != nil {
			return err
		}
	}
	md := rep.markdown()
	fmt.Print(md)
	if opts.out != "" {
		return splice(opts.out, md)
	}
	return nil
}

// runAll runs the selected scenarios. needMySQL makes a missing MariaDB an error
// instead of a skipped table.
func runAll(ctx context.Context, opts options, needMySQL bool) (*report, error) {
	started := time.Now()
	sz := opts.sizes()
	e := &env{}
	if opts.postgres != "" {
		pgURL, e.pgSource = opts.postgres, "the server `-postgres` names"
	} else {
		url, stop, err := startPostgres()
		if err != nil {
			return nil, err
		}
		defer stop()
		pgURL, e.pgSource = url, "a cluster of the bench's own (initdb, default settings but `wal_level=logical`, `max_replication_slots=16`, `max_wal_senders=16`)"
	}
	pool, err := openPostgres(ctx, 16)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	e.pg = pool
	if err := checkLogical(ctx, pool); err != nil {
		return nil, err
	}
	rep := &report{Mode: opts.mode(), Command: opts.command, Date: started, Reps: opts.reps, Sizes: sz, Only: opts.only}
	if opts.runs("write") {
		if e.mysql, err = openMySQL(ctx, 16); err != nil {
			if needMySQL {
				return nil, err
			}
			say("MariaDB is not reachable (%v): its write-cost table is skipped", err)
			rep.MariaDBSkipped = err.Error()
		} else {
			defer e.mysql.Close()
		}
	}
	rep.Machine = describe(ctx, e)
	say("bench: %s run, %d repetition%s", rep.Mode, opts.reps, plural(opts.reps))

	if opts.runs("write") {
		if rep.Write, err = writeScenario(ctx, e, "PostgreSQL", []contender{business, rawPG, watermillPG, outboxPG, outboxTransact, outboxLog}, sz, opts.reps); err != nil {
			return nil, err
		}
		if e.mysql != nil {
			if rep.WriteMy, err = writeScenario(ctx, e, "MariaDB", []contender{businessMy, rawMy, outboxMy}, sz, opts.reps); err != nil {
				return nil, err
			}
		}
	}
	if opts.runs("drain") {
		if rep.Drain, err = drainScenario(ctx, e, relayContenders, sz, opts.reps); err != nil {
			return nil, err
		}
	}
	if opts.runs("latency") {
		if rep.Latency, err = latencyScenario(ctx, e, relayContenders, sz, opts.reps); err != nil {
			return nil, err
		}
	}
	if opts.runs("soak") {
		rate, source, err := soakRate(ctx, e, opts, rep.Drain, sz)
		if err != nil {
			return nil, err
		}
		// Both modes at the same rate: the table mode's measured capacity.
		if rep.Soak, err = soakScenario(ctx, e, outboxPG, rate, source, opts.soakRelays, sz.soakFor, sz.soakWindow); err != nil {
			return nil, err
		}
		if rep.SoakLog, err = soakScenario(ctx, e, outboxLog, rate, source, opts.soakRelays, sz.soakFor, sz.soakWindow); err != nil {
			return nil, err
		}
	}
	rep.Took = time.Since(started)
	say("bench: done in %v", rep.Took.Round(time.Second))
	return rep, nil
}

// soakRate is 70 % of what the machine sustains with writers and relays running
// together (soakCapacity), or of the outbox's drain rate with 1 relay and batch 100
// if that is lower; -soak-rate sets it instead. On a small machine the writers'
// own work comes out of the relays' share, so the drain rate alone would overload
// the soak: its backlog would grow without bound, and it would show nothing about
// steady running.
func soakRate(ctx context.Context, e *env, opts options, drain *drainResult, sz sizes) (float64, string, error) {
	if opts.soakRate > 0 {
		return opts.soakRate, "-soak-rate", nil
	}
	cfg := drainConfig{Backlog: sz.backlog, Batch: 100, Relays: 1}
	var drained float64
	if drain != nil {
		drained = median(drain.Rate[dkey(cfg, outboxPG.name)])
	}
	if drained == 0 {
		rate, _, _, err := drainOne(ctx, e, outboxPG, cfg)
		if err != nil {
			return 0, "", err
		}
		drained = rate
	}
	capacity, err := soakCapacity(ctx, e, opts.soakRelays, sz.soakProbe)
	if err != nil {
		return 0, "", err
	}
	say("soak: the outbox drains %.0f msg/s (%s); writers and %d relays together sustain %.0f msg/s", drained, cfg, opts.soakRelays, capacity)
	return 0.7 * min(drained, capacity), fmt.Sprintf("70%% of the lower of the drain rate (%s msg/s, %s) and what writers and relays sustained together in a %v probe (%s msg/s)",
		kilo(drained), cfg, sz.soakProbe, kilo(capacity)), nil
}
