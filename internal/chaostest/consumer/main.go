// Command consumer is one consumer process for the inbox kill tests: the inbox's
// consume loop (inbox.Consumer) on a Kafka source (kafkatransport.Source), applying
// each record through an inbox on a PostgreSQL store or, with -queue, on an SQS source
// (sqstransport.Source), applying each message through an inbox on a DynamoDB store. Its handler writes one effect per message in
// the unit of work (a row in the effects table; an item under EFFECT#<message id>),
// so the test can count, from outside, how often each message's effect was applied.
// SIGTERM or SIGINT stop it gracefully; SIGKILL stops it as a crash does.
//
// Output lines:
//
//	ready <id>
//	committed <where> <duplicate>   (the message's unit committed; its offset is not
//	                                 committed, or it is not deleted, yet)
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

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

type flags struct {
	pgURL, table, effects           string
	brokers, topic, group           string
	dynamoURL, dynamoTable          string
	sqsURL, queue                   string
	name, id                        string
	pause, session, handlerT, visib time.Duration
	maxPoll                         int
}

func run() error {
	var f flags
	flag.StringVar(&f.pgURL, "postgres", "", "PostgreSQL URL (Kafka mode)")
	flag.StringVar(&f.table, "table", sqlstore.DefaultTable, "outbox table (the inbox table is table_inbox)")
	flag.StringVar(&f.effects, "effects", "", "the application's effects table (Kafka mode)")
	flag.StringVar(&f.brokers, "brokers", "", "comma-separated Kafka seed brokers")
	flag.StringVar(&f.topic, "topic", "", "topic to consume")
	flag.StringVar(&f.group, "group", "", "consumer group")
	flag.StringVar(&f.dynamoURL, "dynamodb", "", "DynamoDB endpoint (SQS mode)")
	flag.StringVar(&f.dynamoTable, "dynamodb-table", "", "DynamoDB table (SQS mode)")
	flag.StringVar(&f.sqsURL, "sqs", "", "SQS endpoint (SQS mode)")
	flag.StringVar(&f.queue, "queue", "", "SQS queue URL: receive from SQS into DynamoDB instead of from Kafka into PostgreSQL")
	flag.StringVar(&f.name, "consumer", "", "inbox consumer name")
	flag.StringVar(&f.id, "id", "", "process id")
	flag.DurationVar(&f.pause, "pause", 0, "time between a unit's commit and its offset commit or delete, so a kill can land there")
	flag.DurationVar(&f.session, "session", 6*time.Second, "group session timeout")
	flag.DurationVar(&f.handlerT, "handler-time", 0, "time each handler takes inside its unit of work")
	flag.DurationVar(&f.visib, "visibility", 2*time.Second, "SQS visibility timeout")
	flag.IntVar(&f.maxPoll, "max-poll", 20, "records per poll")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var mu sync.Mutex
	printf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format, args...)
	}
	committed := func(where string, res inbox.Result) {
		printf("committed %s %t\n", where, res.Duplicate)
		if f.pause > 0 {
			time.Sleep(f.pause)
		}
	}
	if f.queue != "" {
		return runSQS(ctx, f, log, printf, committed)
	}
	return runKafka(ctx, f, log, printf, committed)
}

func runKafka(ctx context.Context, f flags, log *slog.Logger, printf func(string, ...any), committed func(string, inbox.Result)) error {
	pool, err := pgxpool.New(ctx, f.pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: f.table, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()
	in, err := inbox.New(store, inbox.Config{Consumer: f.name, Logger: log})
	if err != nil {
		return err
	}
	client, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(f.brokers, ",")...),
		kgo.ConsumerGroup(f.group), kgo.ConsumeTopics(f.topic), kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
		kgo.SessionTimeout(f.session), kgo.HeartbeatInterval(f.session/10), kgo.RebalanceTimeout(f.session),
	)
	if err != nil {
		return err
	}
	defer client.Close()
	insert := "INSERT INTO " + f.effects + " (msg_id, proc) VALUES ($1, $2)"
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		tx, ok := sqlstore.PgxTx(ctx)
		if !ok {
			return fmt.Errorf("no pgx transaction in the unit of work")
		}
		if _, err := tx.Exec(ctx, insert, d.ID.String(), f.id); err != nil {
			return err
		}
		if f.handlerT > 0 {
			time.Sleep(f.handlerT)
		}
		return nil
	}
	src, err := kafkatransport.NewSource(client, kafkatransport.SourceConfig{MaxPollRecords: f.maxPoll, Logger: log})
	if err != nil {
		return err
	}
	cs, err := inbox.NewConsumer(src, in, handle, inbox.ConsumerConfig{
		RetryBackoff: 10 * time.Millisecond,
		Logger:       log,
		Processed: func(d *inbox.Delivery, res inbox.Result) {
			rec := d.Raw.(*kgo.Record)
			committed(fmt.Sprintf("%d@%d", rec.Partition, rec.Offset), res)
		},
	})
	if err != nil {
		return err
	}
	printf("ready %s\n", f.id)
	return cs.Run(ctx)
}

func runSQS(ctx context.Context, f flags, log *slog.Logger, printf func(string, ...any), committed func(string, inbox.Result)) error {
	creds := credentials.NewStaticCredentialsProvider("test", "test", "")
	dyn := ddb.New(ddb.Options{Region: "us-east-1", BaseEndpoint: aws.String(f.dynamoURL), Credentials: creds})
	store, err := dynamostore.New(dyn, dynamostore.Config{TableName: f.dynamoTable, Logger: log})
	if err != nil {
		return err
	}
	defer func() { _ = store.Close() }()
	in, err := inbox.New(store, inbox.Config{Consumer: f.name, Logger: log})
	if err != nil {
		return err
	}
	client := sqs.New(sqs.Options{Region: "us-east-1", BaseEndpoint: aws.String(f.sqsURL), Credentials: creds})
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		if err := dynamostore.AddItems(ctx, types.TransactWriteItem{Put: &types.Put{
			TableName: aws.String(f.dynamoTable),
			Item: map[string]types.AttributeValue{
				"PK":   &types.AttributeValueMemberS{Value: "EFFECT#" + d.ID.String()},
				"SK":   &types.AttributeValueMemberS{Value: uuid.NewString()},
				"Proc": &types.AttributeValueMemberS{Value: f.id},
			},
		}}); err != nil {
			return err
		}
		if f.handlerT > 0 {
			time.Sleep(f.handlerT)
		}
		return nil
	}
	src, err := sqstransport.NewSource(client, sqstransport.SourceConfig{
		QueueURL: f.queue, WaitTime: time.Second, VisibilityTimeout: f.visib,
		MaxMessages: int32(min(10, f.maxPoll)),
	})
	if err != nil {
		return err
	}
	r, err := inbox.NewConsumer(src, in, handle, inbox.ConsumerConfig{
		Logger:    log,
		Processed: func(d *inbox.Delivery, res inbox.Result) { committed(d.ID.String(), res) },
	})
	if err != nil {
		return err
	}
	printf("ready %s\n", f.id)
	return r.Run(ctx)
}
