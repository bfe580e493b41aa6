package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/internal/testenv"
)

// checkStory runs the walkthrough with opts and checks the outcome of each story.
// run itself fails when a story turns out otherwise; the output is checked too,
// because it is what a reader of the example trusts.
func checkStory(t *testing.T, opts options) string {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), &out, opts), out.String())
	text := out.String()

	for _, want := range []string{
		// 1: the naive dual write loses the message, though the order survives the restart.
		"Orders saved: [1001]. Messages the broker received: 0.",
		// 2: Immediate mode keeps it across the restart, and redelivers after a relay crash.
		"Orders saved: [1002]. Messages waiting in the outbox: 1.",
		"Messages the broker received: 1. Messages still in the outbox: 1.",
		"Messages the broker received: 2, with 1 distinct message id. Still in the outbox: 0.",
		"handles order 1002 once",
		// 3: commit writes both, rollback neither.
		"Orders saved: [1003]. Messages in the outbox: 1. The relay publishes 1; the broker has received 1.",
		"Orders saved: [1003]. Messages in the outbox: 0. The relay publishes 0; the broker has received 1.",
	} {
		assert.Contains(t, text, want)
	}
	assert.Equal(t, 3, strings.Count(text, "=> "), "each story ends with its conclusion")

	// What was read back from the broker: both copies of 1002 with one id, which is
	// also their idempotency key, and 1003 once.
	readBack := regexp.MustCompile(`Read back: topic order-placed, key order-(\d+), payload \{"order":"(\d+)","status":"placed"\}\n` +
		`\s+message id ([0-9a-f-]{36}), idempotency-key ([0-9a-f-]{36})`)
	var orders, ids []string
	for _, m := range readBack.FindAllStringSubmatch(text, -1) {
		assert.Equal(t, m[1], m[2], "key and payload name the same order")
		assert.Equal(t, m[3], m[4], "the idempotency key defaults to the message id")
		orders, ids = append(orders, m[1]), append(ids, m[3])
	}
	require.Equal(t, []string{"1002", "1002", "1003"}, orders, text)
	assert.Equal(t, ids[0], ids[1], "the redelivery is the same message")
	assert.NotEqual(t, ids[1], ids[2])
	return text
}

func TestWalkthrough(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // where the SQLite file goes

	text := checkStory(t, options{})
	assert.Contains(t, text, "in a SQLite file in a temporary directory")
	assert.Contains(t, text, "messages go to a Kafka cluster in this process")
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	assert.Empty(t, left, "the temporary directories are removed")
}

func TestWalkthroughOnPostgres(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL()
	db := connect(t, "PostgreSQL", "pgx", url)

	before := exampleTables(t, db, "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE 'example\\_%'")
	text := checkStory(t, options{Postgres: url})
	assert.Contains(t, text, "outbox in PostgreSQL")
	after := exampleTables(t, db, "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE 'example\\_%'")
	assert.Equal(t, before, after, "the walkthrough drops its tables")
}

func TestWalkthroughOnMySQL(t *testing.T) {
	t.Parallel()
	dsn := testenv.MySQLDSN()
	db := connect(t, "MySQL/MariaDB", "mysql", dsn)

	query := "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name LIKE 'example\\_%'"
	before := exampleTables(t, db, query)
	text := checkStory(t, options{MySQL: dsn})
	assert.Contains(t, text, "outbox in MySQL")
	assert.Equal(t, before, exampleTables(t, db, query), "the walkthrough drops its tables")
}

// TestWalkthroughOnKafkaBrokers runs the -kafka path against a cluster that already
// holds a record and keeps the walkthrough's records between runs, as a real one
// does: each run counts only its own messages.
func TestWalkthroughOnKafkaBrokers(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, topic))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(client.Close)
	require.NoError(t, client.ProduceSync(t.Context(), &kgo.Record{Topic: topic, Value: []byte("not from the outbox")}).FirstErr())

	for range 2 {
		text := checkStory(t, options{Kafka: cluster.ListenAddrs()})
		assert.Contains(t, text, "messages go to Kafka at "+strings.Join(cluster.ListenAddrs(), ","))
	}
}

func TestWalkthroughOnKafkaRefusesAMissingTopic(t *testing.T) {
	t.Parallel()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)

	err = run(t.Context(), &bytes.Buffer{}, options{Kafka: cluster.ListenAddrs()})
	require.ErrorContains(t, err, "create it first")
}

// TestWalkthroughOnSQS runs the -sqs-endpoint path against the SQS emulator, on a
// queue that exists already and holds a message an earlier run left: the walkthrough
// finds the queue and counts only its own messages.
func TestWalkthroughOnSQS(t *testing.T) {
	t.Parallel()
	emulator := sqsemulator.Start(t)
	endpoint := emulator.URL
	client := emulator.Client()
	queue, err := client.CreateQueue(t.Context(), &sqs.CreateQueueInput{QueueName: aws.String("example-orders")})
	require.NoError(t, err)
	_, err = client.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: queue.QueueUrl, MessageBody: aws.String("left over")})
	require.NoError(t, err)

	text := checkStory(t, options{SQSEndpoint: endpoint, SQSQueue: "example-orders"})
	assert.Contains(t, text, "messages go to SQS queue "+aws.ToString(queue.QueueUrl))
}

func TestWalkthroughReportsAWriteError(t *testing.T) {
	t.Parallel()
	err := run(t.Context(), failingWriter{}, options{})
	require.ErrorIs(t, err, assert.AnError)
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, assert.AnError }

func TestFlags(t *testing.T) {
	t.Parallel()
	opts, err := parseFlags([]string{"-postgres", "postgres://h/db", "-kafka", "a:9092,b:9092"}, &bytes.Buffer{})
	require.NoError(t, err)
	assert.Equal(t, options{Postgres: "postgres://h/db", Kafka: []string{"a:9092", "b:9092"}, SQSQueue: topic}, opts)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-postgres", "postgres://h/db", "-mysql", "root@/db"}, "-postgres and -mysql"},
		{[]string{"-kafka", "a:9092", "-sqs-endpoint", "http://127.0.0.1:9324"}, "-kafka and -sqs-endpoint"},
		{[]string{"-sqs-endpoint", "http://127.0.0.1:9324", "-sqs-queue", "orders.fifo"}, "-sqs-queue orders.fifo"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
	} {
		var stderr bytes.Buffer
		_, err := parseFlags(tc.args, &stderr)
		require.Error(t, err, tc.args)
		assert.Contains(t, stderr.String(), tc.want, tc.args)
		assert.Contains(t, stderr.String(), "Usage", "the usage follows the problem")
	}
}

// connect opens a server the test needs; a missing one skips the test, or fails it
// under CI=true.
func connect(t *testing.T, name, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, name, err)
	}
	return db
}

func exampleTables(t *testing.T, db *sql.DB, query string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(t.Context(), query).Scan(&n))
	return n
}
