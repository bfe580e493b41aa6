// Command example walks through the outbox on a real database and a real broker
// protocol, with nothing to install and no server to run:
//
//	go run ./cmd/example
//
// By default the application's orders and its outbox live in one SQLite file in a
// temporary directory (removed at exit), and the relay publishes to a Kafka cluster
// running in process (franz-go's kfake). The example reads every published message
// back from the broker and prints it.
//
// It shows, and checks, three stories:
//
//  1. a naive dual write (save, then publish) that loses its message when the process
//     crashes in between;
//  2. Immediate mode, where the send is durable before Send returns: it survives the
//     crash (the database is closed and opened again) and is redelivered at least once
//     when the relay itself crashes mid-way;
//  3. Transactional mode, where the order and its message commit in one database
//     transaction, and a rollback discards both.
//
// Flags point it at real services instead:
//
//	-postgres URL       PostgreSQL instead of SQLite, e.g. postgres://user@host:5432/db
//	-mysql DSN          MySQL or MariaDB instead of SQLite, e.g. user:pass@tcp(host:3306)/db
//	-kafka host:port    real Kafka brokers (comma-separated); the topic order-placed must exist
//	-sqs-endpoint URL   SQS, or an SQS emulator, instead of Kafka
//	-sqs-queue NAME     the queue's name or URL (default order-placed; created if absent)
//	-amqp URL           RabbitMQ instead of Kafka, e.g. amqp://guest:guest@host:5672/
//	-nats URL           NATS JetStream instead of Kafka, e.g. nats://host:4222 (a stream of its own)
//	-redis host:port    Redis Streams instead of Kafka (a stream of its own)
//	-watermill-amqp URL RabbitMQ through Watermill's AMQP publisher (transport/watermilltransport)
//
// On PostgreSQL and MySQL each story uses tables of its own, with a random suffix, and
// drops them at the end. With -sqs-endpoint, credentials come from AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN (defaults "test"/"test", which emulators
// accept) and the region from AWS_REGION (default us-east-1).
//
// It exits with status 1 if any story does not turn out as told.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	opts, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		os.Exit(2) // the problem and the usage are printed
	}
	if err := run(ctx, os.Stdout, opts); err != nil {
		fmt.Fprintln(os.Stderr, "example:", err)
		os.Exit(1)
	}
}

// options are the command line's choices. The zero value is the default walkthrough:
// SQLite and an in-process Kafka.
type options struct {
	Postgres    string   // PostgreSQL connection URL
	MySQL       string   // MySQL or MariaDB DSN (go-sql-driver/mysql syntax)
	Kafka       []string // seed brokers of a real Kafka cluster
	SQSEndpoint string   // SQS endpoint URL
	SQSQueue    string   // SQS queue name or URL
	AMQP        string   // RabbitMQ URL
	NATS        string   // NATS server URL (JetStream enabled)
	Redis       string   // Redis address, host:port
	Watermill   string   // RabbitMQ URL for Watermill's AMQP publisher
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var opts options
	var kafka string
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&opts.Postgres, "postgres", "", "PostgreSQL `URL`: keep orders and the outbox there instead of in SQLite")
	fs.StringVar(&opts.MySQL, "mysql", "", "MySQL or MariaDB `DSN`: keep orders and the outbox there instead of in SQLite")
	fs.StringVar(&kafka, "kafka", "", "publish to these Kafka brokers (`host:port`, comma-separated) instead of an in-process one; the topic "+topic+" must exist")
	fs.StringVar(&opts.SQSEndpoint, "sqs-endpoint", "", "publish to SQS at this endpoint `URL` (or an emulator) instead of Kafka")
	fs.StringVar(&opts.SQSQueue, "sqs-queue", topic, "SQS queue `name or URL` for -sqs-endpoint; a name is created if absent")
	fs.StringVar(&opts.AMQP, "amqp", "", "publish to RabbitMQ at this `URL` instead of Kafka; declares a fanout exchange and a durable queue of its own, named "+topic+" and a random suffix, and deletes them at exit")
	fs.StringVar(&opts.Watermill, "watermill-amqp", "", "publish through Watermill's AMQP publisher to RabbitMQ at this `URL` instead of Kafka; declares a durable queue of its own, named "+topic+" and a random suffix, and deletes it at exit")
	fs.StringVar(&opts.NATS, "nats", "", "publish to NATS JetStream at this `URL` instead of Kafka; creates a stream of its own and deletes it at exit")
	fs.StringVar(&opts.Redis, "redis", "", "append to a Redis stream at this `host:port` instead of Kafka; the stream is the run's own, deleted at exit")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected argument %q", fs.Arg(0))
		fmt.Fprintln(stderr, err)
		fs.Usage()
		return options{}, err
	}
	if kafka != "" {
		opts.Kafka = strings.Split(kafka, ",")
	}
	if err := opts.validate(); err != nil {
		fmt.Fprintln(stderr, err)
		fs.Usage()
		return options{}, err
	}
	return opts, nil
}

// validate reports flags that cannot go together.
func (o options) validate() error {
	if o.Postgres != "" && o.MySQL != "" {
		return fmt.Errorf("-postgres and -mysql: choose one database")
	}
	if len(o.Kafka) > 0 && o.SQSEndpoint != "" {
		return fmt.Errorf("-kafka and -sqs-endpoint: choose one broker")
	}
	if o.AMQP != "" && (len(o.Kafka) > 0 || o.SQSEndpoint != "") {
		return fmt.Errorf("-amqp and another broker: choose one broker")
	}
	if o.Watermill != "" && (len(o.Kafka) > 0 || o.SQSEndpoint != "" || o.AMQP != "") {
		return fmt.Errorf("-watermill-amqp and another broker: choose one broker")
	}
	if o.NATS != "" && (len(o.Kafka) > 0 || o.SQSEndpoint != "" || o.AMQP != "" || o.Watermill != "") {
		return fmt.Errorf("-nats and another broker: choose one broker")
	}
	if o.Redis != "" && (len(o.Kafka) > 0 || o.SQSEndpoint != "" || o.AMQP != "" || o.Watermill != "" || o.NATS != "") {
		return fmt.Errorf("-redis and another broker: choose one broker")
	}
	if o.SQSEndpoint != "" && strings.HasSuffix(o.SQSQueue, ".fifo") {
		// A FIFO queue drops a copy whose message id it saw in the last five minutes,
		// which would hide the redelivery story 2 shows.
		return fmt.Errorf("-sqs-queue %s: use a standard queue; a FIFO queue deduplicates the redelivery the walkthrough shows", o.SQSQueue)
	}
	return nil
}
