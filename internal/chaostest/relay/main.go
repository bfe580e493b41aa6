// Command relay is one outbox relay process for the process-kill tests: a relay
// on a PostgreSQL store publishing to Kafka, the store in the table mode or, with
// -log-mode, in the log mode (the relay then also reads the stream while it holds
// the stream lease). It prints the buckets it owns whenever
// they change (and every few hundred milliseconds), and how many messages it has
// published, so the test can follow its leases from outside. SIGTERM or SIGINT stop
// it gracefully, with Stop given the signal's (already cancelled) context; SIGKILL
// stops it as a crash does.
//
// Output lines:
//
//	ready <relay-id>
//	owned <relay-id> <published> <bucket,bucket,...>
//	acked <messages>       (with -ack-delay: a batch the broker acknowledged)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		pgURL        = flag.String("postgres", "", "PostgreSQL URL")
		table        = flag.String("table", sqlstore.DefaultTable, "outbox table")
		brokers      = flag.String("brokers", "", "comma-separated Kafka seed brokers")
		id           = flag.String("id", "", "relay id")
		buckets      = flag.Int("buckets", driver.DefaultBucketCount, "bucket count")
		batch        = flag.Int("batch", 20, "batch size")
		lease        = flag.Duration("lease", 2*time.Second, "lease duration")
		renew        = flag.Duration("renew", 500*time.Millisecond, "lease renew interval")
		poll         = flag.Duration("poll", 20*time.Millisecond, "poll interval")
		publishDelay = flag.Duration("publish-delay", 0, "extra time every publish takes before it is sent")
		ackDelay     = flag.Duration("ack-delay", 0, "time between the broker's acknowledgement and the relay hearing of it, so a kill can land there")
		logMode      = flag.Bool("log-mode", false, "open the store in the log mode (PostgreSQL with wal_level=logical, migrated with its slot)")
		retryBudget  = flag.Duration("stream-retry-budget", 0, "relay.Config.StreamRetryBudget (0: the default)")
		maxAttempts  = flag.Int("max-attempts", 1_000_000, "relay.Config.MaxAttempts")
	)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	pool, err := pgxpool.New(ctx, *pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	mode := sqlstore.TableMode
	if *logMode {
		mode = sqlstore.LogMode
	}
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: *table, BucketCount: *buckets, Mode: mode, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()

	client, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*brokers, ",")...), kgo.ProducerLinger(0))
	if err != nil {
		return err
	}
	defer client.Close()
	tr, err := kafkatransport.New(client, kafkatransport.Config{AckTimeout: time.Second})
	if err != nil {
		return err
	}
	out := &syncWriter{}
	counted := &countingTransport{next: tr, delay: *publishDelay, ackDelay: *ackDelay, out: out}

	d, err := relay.New(store, counted, relay.Config{
		RelayID:            *id,
		BatchSize:          *batch,
		PollInterval:       *poll,
		LeaseDuration:      *lease,
		LeaseRenewInterval: *renew,
		BackoffBase:        10 * time.Millisecond,
		BackoffMax:         200 * time.Millisecond,
		MaxAttempts:        *maxAttempts,
		StreamRetryBudget:  *retryBudget,
		Logger:             log,
	})
	if err != nil {
		return err
	}
	if err := d.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	out.printf("ready %s\n", d.RelayID())

	var last []int
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	reported := time.Time{}
	for {
		select {
		case <-ctx.Done():
			// Stop with the signal's context, already done, as a service that defers
			// Stop with the context it started with does: the leases are still handed
			// back, and Stop reports the context's end.
			if err := d.Stop(ctx); err != nil && !errors.Is(err, context.Canceled) {
				return err
			}
			return nil
		case <-d.Stopped():
			return fmt.Errorf("relay stopped on its own: %w", d.Err())
		case <-tick.C:
			owned := d.Owned()
			if !slices.Equal(owned, last) || time.Since(reported) > 300*time.Millisecond {
				parts := make([]string, len(owned))
				for i, b := range owned {
					parts[i] = strconv.Itoa(b)
				}
				out.printf("owned %s %d %s\n", d.RelayID(), counted.published.Load(), strings.Join(parts, ","))
				last, reported = owned, time.Now()
			}
		}
	}
}
