// Command consumer is one consumer process for the inbox kill test: a Kafka consume
// loop (kafka.Consumer) applying each record through an inbox on a PostgreSQL store.
// Its handler inserts one row per record into an effects table in the unit of work,
// so the test can count, from outside, how often each message's effect was applied.
// SIGTERM or SIGINT stop it gracefully; SIGKILL stops it as a crash does.
//
// Output lines:
//
//	ready <id>
//	committed <partition> <offset> <duplicate>   (the record's unit committed; its
//	                                              offset is not committed yet)
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/inbox"
	sqlstore "github.com/outboxkit/outbox/store/sql"
	"github.com/outboxkit/outbox/transport/kafka"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		pgURL    = flag.String("postgres", "", "PostgreSQL URL")
		table    = flag.String("table", sqlstore.DefaultTable, "outbox table (the inbox table is table_inbox)")
		effects  = flag.String("effects", "", "the application's effects table")
		brokers  = flag.String("brokers", "", "comma-separated Kafka seed brokers")
		topic    = flag.String("topic", "", "topic to consume")
		group    = flag.String("group", "", "consumer group")
		name     = flag.String("consumer", "", "inbox consumer name")
		id       = flag.String("id", "", "process id, recorded with each effect")
		pause    = flag.Duration("pause", 0, "time between a unit's commit and its offset commit, so a kill can land there")
		session  = flag.Duration("session", 6*time.Second, "group session timeout")
		maxPoll  = flag.Int("max-poll", 20, "records per poll")
		handlerT = flag.Duration("handler-time", 0, "time each handler takes inside its unit of work")
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
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: *table, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()
	in, err := inbox.New(store, inbox.Config{Consumer: *name, Logger: log})
	if err != nil {
		return err
	}
	client, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(*brokers, ",")...),
		kgo.ConsumerGroup(*group), kgo.ConsumeTopics(*topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.SessionTimeout(*session), kgo.HeartbeatInterval(*session/10), kgo.RebalanceTimeout(*session),
	)
	if err != nil {
		return err
	}
	defer client.Close()

	var mu sync.Mutex
	printf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format, args...)
	}
	insert := "INSERT INTO " + *effects + " (msg_id, proc) VALUES ($1, $2)"
	handle := func(ctx context.Context, d kafka.Delivery) error {
		tx, ok := sqlstore.PgxTx(ctx)
		if !ok {
			return fmt.Errorf("no pgx transaction in the unit of work")
		}
		if _, err := tx.Exec(ctx, insert, d.ID.String(), *id); err != nil {
			return err
		}
		if *handlerT > 0 {
			time.Sleep(*handlerT)
		}
		return nil
	}
	cs, err := kafka.NewConsumer(client, in, handle, kafka.ConsumerConfig{
		MaxPollRecords: *maxPoll,
		RetryBackoff:   10 * time.Millisecond,
		Logger:         log,
		Processed: func(d kafka.Delivery, res inbox.Result) {
			printf("committed %d %d %t\n", *d.Partition, d.Offset, res.Duplicate)
			if *pause > 0 {
				time.Sleep(*pause)
			}
		},
	})
	if err != nil {
		return err
	}
	printf("ready %s\n", *id)
	return cs.Run(ctx)
}
