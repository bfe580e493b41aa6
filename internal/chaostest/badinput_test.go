package chaostest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// pendingCount counts what a store holds in any status.
func pendingCount(t *testing.T, h driver.Handle) int {
	t.Helper()
	return len(stored(t, h))
}

// stored returns every envelope a store holds, pending and parked.
func stored(t *testing.T, h driver.Handle) []*driver.Envelope {
	t.Helper()
	s := h.Driver()
	var all []*driver.Envelope
	for b := range s.BucketCount() {
		head, err := s.Fetch(context.Background(), b, 100_000)
		require.NoError(t, err)
		all = append(all, head.Envelopes...)
	}
	if admin, ok := s.(driver.Admin); ok {
		parked, err := admin.List(context.Background(), driver.Parked, driver.Cursor{}, 100_000)
		require.NoError(t, err)
		all = append(all, parked...)
	}
	return all
}

func sqliteStore(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = uniqueTable("bad")
	}
	s, err := sqlstore.NewDB(sqliteDB(t), sqlstore.SQLite, cfg)
	return migrated(t, s, err)
}

// newSender is a capture on s with cfg, failing the test if it cannot be built.
func newSender(t *testing.T, s outbox.Store, cfg outbox.SenderConfig) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(s, cfg)
	require.NoError(t, err)
	return c
}

// requireTooLarge checks a refusal for size: ErrTooLarge, which is also an invalid
// message, saying nothing was written.
func requireTooLarge(t *testing.T, err error) {
	t.Helper()
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage, "ErrTooLarge is an invalid message")
	require.Contains(t, err.Error(), "nothing was written")
}

// TestOversizedRejectedAtCapture: a message over the store's limit, or over the
// limit of the transport the sender is wired with (SenderConfig.Transport: Kafka,
// SQS), fails at Send with ErrTooLarge (also an ErrInvalidMessage), outside a unit
// of work (Immediate) and inside one (Transactional), and nothing (not even the rest
// of the unit of work) is written.
func TestOversizedRejectedAtCapture(t *testing.T) {
	ctx := context.Background()
	big := outbox.Message{Topic: "t", Key: []byte("k"), Payload: bytes.Repeat([]byte{0xff}, 2000)}
	small := outbox.Message{Topic: "t", Key: []byte("k"), Payload: []byte("ok")}

	t.Run("store limit/memory immediate", func(t *testing.T) {
		s, err := memstore.New(memstore.Config{MaxMessageSize: 1000})
		require.NoError(t, err)
		ob := newSender(t, s, outbox.SenderConfig{Mode: outbox.Immediate})
		requireTooLarge(t, ob.Send(ctx, big))
		require.Zero(t, pendingCount(t, s))
	})
	t.Run("store limit/memory unit of work", func(t *testing.T) {
		s, err := memstore.New(memstore.Config{MaxMessageSize: 1000})
		require.NoError(t, err)
		ob := newSender(t, s, outbox.SenderConfig{})
		err = s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, ob.Send(ctx, small))
			return ob.Send(ctx, big)
		})
		requireTooLarge(t, err)
		require.Zero(t, pendingCount(t, s), "the unit of work must write nothing")
	})
	t.Run("store limit/sqlite unit of work", func(t *testing.T) {
		s := sqliteStore(t, sqlstore.Config{MaxMessageSize: 1000})
		ob := newSender(t, s, outbox.SenderConfig{})
		err := s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, ob.Send(ctx, small))
			return ob.Send(ctx, big)
		})
		requireTooLarge(t, err)
		require.Zero(t, pendingCount(t, s), "the unit of work must write nothing")
	})
	t.Run("store limit/dynamodb unit of work", func(t *testing.T) {
		client := dynamoClient(t)
		cfg := dynamostore.Config{TableName: "outbox"}
		require.NoError(t, dynamostore.CreateIfNotExists(ctx, client, cfg))
		s, err := dynamostore.New(client, cfg)
		require.NoError(t, err)
		ob := newSender(t, s, outbox.SenderConfig{})
		huge := outbox.Message{Topic: "t", Key: []byte("k"), Payload: bytes.Repeat([]byte{1}, s.MaxMessageSize()+1)}
		err = s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, ob.Send(ctx, small))
			return ob.Send(ctx, huge)
		})
		requireTooLarge(t, err)
		require.Zero(t, pendingCount(t, s), "the unit of work must write nothing")
	})
	t.Run("transport limit/sqs", func(t *testing.T) {
		// The transport never dials at construction; its limit is what capture needs.
		tr, err := sqstransport.New(awssqs.New(awssqs.Options{Region: "us-east-1"}), sqstransport.Config{QueueLimit: sqstransport.MinQueueLimit})
		require.NoError(t, err)
		require.Less(t, tr.MaxMessageSize(), sqstransport.MinQueueLimit, "the limit leaves room for the attributes the transport adds")
		s, err := memstore.New(memstore.Config{}) // the store alone would take it
		require.NoError(t, err)
		ob := newSender(t, s, outbox.SenderConfig{Mode: outbox.Immediate, Transport: tr})
		// Wiring the transport is the one step: its limit is the sender's.
		requireTooLarge(t, ob.Send(ctx, sized(tr.MaxMessageSize()+1)))
		over := outbox.Message{Topic: "t", Payload: bytes.Repeat([]byte{'a'}, tr.MaxMessageSize())}
		requireTooLarge(t, ob.Send(ctx, over))
		require.Zero(t, pendingCount(t, s))
		require.NoError(t, ob.Send(ctx, sized(tr.MaxMessageSize())), "a message exactly at the transport's limit is accepted")
		require.NoError(t, ob.Send(ctx, small))
		require.Equal(t, 2, pendingCount(t, s))
	})
	t.Run("transport limit/kafka", func(t *testing.T) {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
		require.NoError(t, err)
		defer cluster.Close()
		client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
		require.NoError(t, err)
		defer client.Close()
		tr, err := kafkatransport.New(client, kafkatransport.Config{MaxMessageSize: 1500})
		require.NoError(t, err)
		s, err := memstore.New(memstore.Config{}) // the store alone would take it
		require.NoError(t, err)
		ob := newSender(t, s, outbox.SenderConfig{Transport: tr})
		err = s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, ob.Send(ctx, small))
			return ob.Send(ctx, big)
		})
		requireTooLarge(t, err)
		require.Zero(t, pendingCount(t, s), "the unit of work must write nothing")
		// The sender's limit is the transport's 1500 bytes, to the byte.
		requireTooLarge(t, s.Transact(ctx, func(ctx context.Context) error { return ob.Send(ctx, sized(1501)) }))
		require.Zero(t, pendingCount(t, s))
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error { return ob.Send(ctx, sized(1500)) }))
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error { return ob.Send(ctx, small) }))
		require.Equal(t, 2, pendingCount(t, s))
	})
}

// sized is a message of exactly size bytes ([outbox.Message.Size]).
func sized(size int) outbox.Message {
	m := outbox.Message{Topic: "t", Key: []byte("k")}
	m.Payload = bytes.Repeat([]byte{'x'}, size-m.Size())
	return m
}

// limitedTransport is a Recorder with a message-size limit, as a real transport
// declares one through driver.SizeLimiter.
type limitedTransport struct {
	*outboxtest.Recorder
	max int
}

func (l limitedTransport) MaxMessageSize() int { return l.max }

// TestOversizedForTransportRefusedOnEveryStore: on every store, a sender wired with a
// transport whose limit is below the store's (SenderConfig.Transport) refuses a
// message over the transport's limit at Send with ErrTooLarge, which also satisfies
// errors.Is(err, outbox.ErrInvalidMessage), in Immediate mode and inside a unit of
// work, and writes nothing; a message exactly at the limit is accepted.
func TestOversizedForTransportRefusedOnEveryStore(t *testing.T) {
	const limit = 1000
	onEveryStore(t, func(t *testing.T, s outboxtest.Store) {
		ctx := context.Background()
		tr := limitedTransport{outboxtest.NewRecorder(), limit}
		unit := newSender(t, s, outbox.SenderConfig{Transport: tr})
		immediate := newSender(t, s, outbox.SenderConfig{Mode: outbox.Immediate, Transport: tr})

		requireTooLarge(t, immediate.Send(ctx, sized(limit+1)))
		err := s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, unit.Send(ctx, sized(10)))
			return unit.Send(ctx, sized(limit+1))
		})
		requireTooLarge(t, err)
		require.Zero(t, pendingCount(t, s), "nothing may be written")

		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error { return unit.Send(ctx, sized(limit)) }),
			"a message exactly at the limit is accepted")
		require.Equal(t, 1, pendingCount(t, s))
	})
}

// TestInvalidTopicAndRoute: no topic, a topic with no route, a negative partition or
// an empty header key is refused before anything is written; a route that would
// never work (empty topic, nil terminal) panics at registration.
func TestInvalidTopicAndRoute(t *testing.T) {
	ctx := context.Background()
	s, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	ob := newSender(t, s, outbox.SenderConfig{Mode: outbox.Immediate})
	router := middleware.NewRouter()
	router.Handle("orders", ob)

	err = router.Send(ctx, outbox.Message{Topic: "invoices", Payload: []byte("x")})
	require.ErrorIs(t, err, middleware.ErrNoRoute)
	require.Contains(t, err.Error(), "invoices")
	require.ErrorIs(t, ob.Send(ctx, outbox.Message{Payload: []byte("x")}), outbox.ErrInvalidMessage)
	neg := int32(-1)
	require.ErrorIs(t, router.Send(ctx, outbox.Message{Topic: "orders", Partition: &neg}), outbox.ErrInvalidMessage)
	require.ErrorIs(t, router.Send(ctx, outbox.Message{Topic: "orders", Headers: []outbox.Header{{Key: "", Value: []byte("v")}}}), outbox.ErrInvalidMessage)
	require.Zero(t, pendingCount(t, s))
	require.Panics(t, func() { router.Handle("", ob) }, "an empty topic is a programming error")
	require.Panics(t, func() { router.Handle("payments", nil) }, "a route with no terminal is a programming error")
}

// TestInvalidTextRefusedOnEveryStore: a topic or a header key holding a NUL byte or
// invalid UTF-8 fails with ErrInvalidMessage on every store, whether it comes through
// capture (Immediate, or inside a unit of work) or as a hand-built envelope given to
// Store.Enqueue, never with a raw database error, and nothing is written. Valid
// non-ASCII text is stored.
func TestInvalidTextRefusedOnEveryStore(t *testing.T) {
	bad := []outbox.Message{
		{Topic: "orders\x00"},
		{Topic: "\x00"},
		{Topic: "orders\xff"},
		{Topic: "caf\xc3"}, // a rune cut short
		{Topic: "orders", Headers: []outbox.Header{{Key: "trace\x00", Value: []byte("v")}}},
		{Topic: "orders", Headers: []outbox.Header{{Key: "ok", Value: []byte("v")}, {Key: "\xfe\xff", Value: []byte("v")}}},
	}
	onEveryStore(t, func(t *testing.T, s outboxtest.Store) {
		ctx := context.Background()
		unit := newSender(t, s, outbox.SenderConfig{})
		immediate := newSender(t, s, outbox.SenderConfig{Mode: outbox.Immediate})
		for i, m := range bad {
			m.Key, m.Payload = []byte("k"), []byte("p")
			require.ErrorIs(t, immediate.Send(ctx, m), outbox.ErrInvalidMessage, "case %d, Immediate", i)
			err := s.Transact(ctx, func(ctx context.Context) error {
				require.NoError(t, unit.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("k")}))
				return unit.Send(ctx, m)
			})
			require.ErrorIs(t, err, outbox.ErrInvalidMessage, "case %d, unit of work", i)

			// A writer that builds envelopes itself reaches the store's own check.
			env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte("k")}, s.Driver().BucketCount())
			require.NoError(t, err)
			env.Topic, env.Headers = m.Topic, m.Headers
			require.ErrorIs(t, s.Driver().Enqueue(ctx, env), outbox.ErrInvalidMessage, "case %d, driver.Store.Enqueue", i)
		}
		require.Zero(t, pendingCount(t, s), "nothing may be written")

		good := outbox.Message{Topic: "заказы-ü", Key: []byte("k"), Headers: []outbox.Header{{Key: "ключ", Value: []byte{0, 0xff}}}}
		require.NoError(t, immediate.Send(ctx, good))
		got := stored(t, s)
		require.Len(t, got, 1)
		require.Equal(t, good.Topic, got[0].Topic)
		require.Equal(t, good.Headers, got[0].Headers)
	})
}

// TestTableNamesMustBeIdentifiers: a table name that is not a plain identifier is
// refused when the store is built, with an error naming the field; nothing reaches
// the database. The PostgreSQL dialect allows the most (schema-qualified names), so
// it is the one checked; the store is built on a handle it never uses.
func TestTableNamesMustBeIdentifiers(t *testing.T) {
	db := sqliteDB(t)
	bad := []string{
		"orders; drop table users", "1orders", "or-ders", "a.b.c", `"quoted"`, "or ders",
		"orders--", "o'rders", strings.Repeat("a", 64), ".orders", "orders.", "ördërs", "orders\x00",
	}
	for _, name := range bad {
		for field, cfg := range map[string]sqlstore.Config{
			"Table":         {Table: name},
			"LeaseTable":    {LeaseTable: name},
			"RelayTable":    {RelayTable: name},
			"NotifyChannel": {NotifyChannel: name},
		} {
			if field == "NotifyChannel" && strings.Contains(name, ".") {
				continue // a channel is one identifier; dots in tables mean a schema
			}
			_, err := sqlstore.NewDB(db, sqlstore.PostgreSQL, cfg)
			require.Error(t, err, "%s %q must be refused", field, name)
			require.Contains(t, err.Error(), field, "the error must name the field for %q", name)
		}
	}
	for _, name := range []string{"orders", "_o1", "billing.orders", strings.Repeat("a", 52)} {
		_, err := sqlstore.NewDB(db, sqlstore.PostgreSQL, sqlstore.Config{Table: name})
		require.NoError(t, err, "%q is a valid table name", name)
	}
}

// TestBucketCountsThatDisagree: a writer, store and relay with different bucket
// counts fail loudly with ErrMisconfigured, and the message a mismatched writer did
// manage to store is kept, not lost.
func TestBucketCountsThatDisagree(t *testing.T) {
	ctx := context.Background()
	s8, err := memstore.New(memstore.Config{BucketCount: 8})
	require.NoError(t, err)

	env4, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: []byte("k")}, 4)
	require.NoError(t, err)
	require.ErrorIs(t, s8.Driver().Enqueue(ctx, env4), outbox.ErrMisconfigured, "a store refuses another writer's count")
	require.Zero(t, pendingCount(t, s8))

	_, err = relay.New(s8, outboxtest.NewRecorder(), relay.Config{BucketCount: 4})
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "a relay refuses a store with another count")

	// Two processes configured differently on one table: the writer's store has 4
	// buckets, the relay's 8. The tables record the count they were migrated for, so
	// the relay refuses to start, naming both counts; the message stays.
	table := uniqueTable("buckets")
	db := sqliteDB(t)
	writer, err := sqlstore.NewDB(db, sqlstore.SQLite, sqlstore.Config{Table: table, BucketCount: 4})
	writer = migrated(t, writer, err)
	relayStore, err := sqlstore.NewDB(db, sqlstore.SQLite, sqlstore.Config{Table: table, BucketCount: 8})
	require.NoError(t, err)
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: []byte("k")}, 4)
	require.NoError(t, err)
	env.Bucket = 1 // a bucket both counts have
	require.NoError(t, writer.Driver().Enqueue(ctx, env))

	rec := outboxtest.NewRecorder()
	d, err := relay.New(relayStore, rec, relay.Config{ // the relay takes its store's 8
		PollInterval:  10 * time.Millisecond,
		LeaseDuration: 600 * time.Millisecond, LeaseRenewInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	err = d.Start(ctx)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "migrated for 4 buckets")
	require.Zero(t, rec.Len(), "nothing may be published under the wrong count")
	found, err := writer.Driver().(driver.Finder).Find(ctx, env.ID)
	require.NoError(t, err, "the message must still be stored")
	require.Equal(t, driver.Pending, found.Status)
}

// TestTransactionalSendOutsideUnitOfWork: on every store, a send with the default
// (Transactional) sender and a ctx that is in no unit of work fails at Send with
// ErrNoTransaction, whose text names the fix, and nothing is written.
func TestTransactionalSendOutsideUnitOfWork(t *testing.T) {
	onEveryStore(t, func(t *testing.T, s outboxtest.Store) {
		ctx := context.Background()
		ob := newSender(t, s, outbox.SenderConfig{})
		require.Equal(t, outbox.Transactional, outbox.SenderConfig{}.Mode, "Transactional is the default")
		err := ob.Send(ctx, outbox.Message{Topic: "t", Payload: []byte("x")})
		require.ErrorIs(t, err, outbox.ErrNoTransaction)
		require.Contains(t, err.Error(), "the ctx that Transact passes to its function")
		require.Contains(t, err.Error(), "outbox.Immediate")
		require.Zero(t, pendingCount(t, s))
	})
}

// TestSendWithOuterCtxInsideTransact: on every store, a send made inside Transact but
// with the ctx Transact was called with (not the one it passes to fn) is outside the
// unit: it fails with ErrNoTransaction, whose text says to use the ctx Transact passes
// to its function; a handler that returns that error rolls the unit back, so nothing
// is written, not even the sends made with the right ctx.
func TestSendWithOuterCtxInsideTransact(t *testing.T) {
	onEveryStore(t, func(t *testing.T, s outboxtest.Store) {
		outer := context.Background()
		ob := newSender(t, s, outbox.SenderConfig{})
		var sendErr error
		err := s.Transact(outer, func(ctx context.Context) error {
			require.NoError(t, ob.Send(ctx, outbox.Message{Topic: "t", Payload: []byte("right ctx")}))
			sendErr = ob.Send(outer, outbox.Message{Topic: "t", Payload: []byte("outer ctx")})
			return sendErr
		})
		require.ErrorIs(t, sendErr, outbox.ErrNoTransaction)
		require.Contains(t, sendErr.Error(), "send with the ctx that Transact passes to its function (not the ctx Transact was called with)")
		require.ErrorIs(t, err, outbox.ErrNoTransaction, "Transact returns fn's error as is")
		require.Zero(t, pendingCount(t, s), "the unit rolled back: nothing is written")
	})
}

// TestStoreUsedBeforeMigrate: on every SQL store (PostgreSQL through pgx and gorm,
// MariaDB, SQLite), using a store whose tables were never created fails with an error
// wrapping ErrMisconfigured that says to run Migrate, not with a raw "relation does
// not exist": an Immediate send, a unit of work (whose application write rolls back
// with it) and a relay's sweep. Once migrated, the same calls work.
func TestStoreUsedBeforeMigrate(t *testing.T) {
	for _, k := range sqlKinds() {
		t.Run(k.name, func(t *testing.T) {
			ctx := context.Background()
			s, db := k.open(t)
			app := uniqueTable("app")
			_, err := db.ExecContext(ctx, "CREATE TABLE "+app+" (id INTEGER PRIMARY KEY)")
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.ExecContext(context.Background(), "DROP TABLE "+app) })
			appRows := func() int {
				var n int
				require.NoError(t, db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+app).Scan(&n))
				return n
			}
			requireMigrate := func(err error, what string) {
				t.Helper()
				require.ErrorIs(t, err, outbox.ErrMisconfigured, what)
				require.Contains(t, err.Error(), "Migrate", what)
			}

			unit := newSender(t, s, outbox.SenderConfig{})
			immediate := newSender(t, s, outbox.SenderConfig{Mode: outbox.Immediate})
			msg := outbox.Message{Topic: "t", Key: []byte("k"), Payload: []byte("p")}
			requireMigrate(immediate.Send(ctx, msg), "an Immediate send")
			order := func(id int) error {
				return s.Transact(ctx, func(ctx context.Context) error {
					if err := execInUnit(ctx, fmt.Sprintf("INSERT INTO %s (id) VALUES (%d)", app, id)); err != nil {
						return err
					}
					return unit.Send(ctx, msg)
				})
			}
			requireMigrate(order(1), "a unit of work")
			require.Zero(t, appRows(), "the application's write rolls back with the unit")
			d, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: "early", Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			_, err = d.RunOnce(ctx)
			requireMigrate(err, "a relay's sweep")

			s = migrated(t, s, nil)
			require.NoError(t, immediate.Send(ctx, msg))
			require.NoError(t, order(2))
			require.Equal(t, 1, appRows())
			require.Equal(t, 2, pendingCount(t, s))
		})
	}
}

// countingDynamo counts the requests a DynamoDB store makes.
type countingDynamo struct {
	*ddb.Client
	requests atomic.Int64
}

func (c *countingDynamo) Query(ctx context.Context, in *ddb.QueryInput, o ...func(*ddb.Options)) (*ddb.QueryOutput, error) {
	c.requests.Add(1)
	return c.Client.Query(ctx, in, o...)
}

func (c *countingDynamo) UpdateItem(ctx context.Context, in *ddb.UpdateItemInput, o ...func(*ddb.Options)) (*ddb.UpdateItemOutput, error) {
	c.requests.Add(1)
	return c.Client.UpdateItem(ctx, in, o...)
}

func (c *countingDynamo) PutItem(ctx context.Context, in *ddb.PutItemInput, o ...func(*ddb.Options)) (*ddb.PutItemOutput, error) {
	c.requests.Add(1)
	return c.Client.PutItem(ctx, in, o...)
}

func (c *countingDynamo) DeleteItem(ctx context.Context, in *ddb.DeleteItemInput, o ...func(*ddb.Options)) (*ddb.DeleteItemOutput, error) {
	c.requests.Add(1)
	return c.Client.DeleteItem(ctx, in, o...)
}

func (c *countingDynamo) BatchWriteItem(ctx context.Context, in *ddb.BatchWriteItemInput, o ...func(*ddb.Options)) (*ddb.BatchWriteItemOutput, error) {
	c.requests.Add(1)
	return c.Client.BatchWriteItem(ctx, in, o...)
}

func (c *countingDynamo) BatchGetItem(ctx context.Context, in *ddb.BatchGetItemInput, o ...func(*ddb.Options)) (*ddb.BatchGetItemOutput, error) {
	c.requests.Add(1)
	return c.Client.BatchGetItem(ctx, in, o...)
}

func (c *countingDynamo) TransactWriteItems(ctx context.Context, in *ddb.TransactWriteItemsInput, o ...func(*ddb.Options)) (*ddb.TransactWriteItemsOutput, error) {
	c.requests.Add(1)
	return c.Client.TransactWriteItems(ctx, in, o...)
}

// TestDynamoDBUnitOfWorkOverItsLimits: a DynamoDB unit of work beyond one
// TransactWriteItems request (more than 100 items, messages and application items
// together) fails with ErrTooLarge, at AddItems when the application's items alone
// are too many or at commit otherwise, before anything is sent: neither the messages
// nor the application's items are written. A unit with nothing in it returns nil and
// makes no request; a unit at the limit commits.
func TestDynamoDBUnitOfWorkOverItsLimits(t *testing.T) {
	ctx := context.Background()
	client := &countingDynamo{Client: dynamoClient(t)}
	cfg := dynamostore.Config{TableName: "outbox", BucketCount: 4}
	require.NoError(t, dynamostore.CreateIfNotExists(ctx, client.Client, cfg))
	s, err := dynamostore.New(client, cfg)
	require.NoError(t, err)
	defer func() { _ = s.Close() }()
	ob := newSender(t, s, outbox.SenderConfig{})

	app := ddbtypes.TransactWriteItem{Put: &ddbtypes.Put{TableName: aws.String("outbox"), Item: map[string]ddbtypes.AttributeValue{
		"PK": &ddbtypes.AttributeValueMemberS{Value: "APP#1"}, "SK": &ddbtypes.AttributeValueMemberS{Value: "state"},
	}}}
	// unit adds the application item (if withApp) and sends n messages.
	unit := func(withApp bool, n int) error {
		return s.Transact(ctx, func(ctx context.Context) error {
			if withApp {
				if err := dynamostore.AddItems(ctx, app); err != nil {
					return err
				}
			}
			for i := range n {
				if err := ob.Send(ctx, outbox.Message{Topic: "t", Key: []byte{byte(i)}, Payload: []byte("p")}); err != nil {
					return err
				}
			}
			return nil
		})
	}

	err = unit(true, dynamostore.MaxEnqueue)
	require.ErrorIs(t, err, outbox.ErrTooLarge, "100 messages and an application item exceed one request")
	require.Contains(t, err.Error(), "101 items")
	require.Contains(t, err.Error(), "nothing was written")
	require.ErrorIs(t, unit(false, dynamostore.MaxEnqueue+1), outbox.ErrTooLarge, "101 messages exceed one request")
	err = s.Transact(ctx, func(ctx context.Context) error {
		for i := range dynamostore.MaxEnqueue {
			require.NoError(t, ob.Send(ctx, outbox.Message{Topic: "t", Key: []byte{byte(i)}}))
		}
		return dynamostore.AddItems(ctx, app)
	})
	require.ErrorIs(t, err, outbox.ErrTooLarge, "an item added to a unit already full of messages is refused at commit")
	require.Contains(t, err.Error(), "nothing was written")
	many := make([]ddbtypes.TransactWriteItem, dynamostore.MaxEnqueue+1)
	for i := range many {
		many[i] = ddbtypes.TransactWriteItem{Put: &ddbtypes.Put{TableName: aws.String("outbox"), Item: map[string]ddbtypes.AttributeValue{
			"PK": &ddbtypes.AttributeValueMemberS{Value: fmt.Sprintf("APP#%d", i)}, "SK": &ddbtypes.AttributeValueMemberS{Value: "state"},
		}}}
	}
	err = s.Transact(ctx, func(ctx context.Context) error {
		require.NoError(t, ob.Send(ctx, outbox.Message{Topic: "t", Key: []byte("k")}))
		return dynamostore.AddItems(ctx, many...)
	})
	require.ErrorIs(t, err, outbox.ErrTooLarge, "AddItems refuses more application items than one request takes")
	require.Contains(t, err.Error(), "nothing was added")
	require.Zero(t, pendingCount(t, s), "a refused unit of work writes nothing")
	out, err := client.Client.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String("outbox"), Key: app.Put.Item})
	require.NoError(t, err)
	require.Empty(t, out.Item, "the application's item is not written either")

	before := client.requests.Load()
	require.NoError(t, unit(false, 0), "an empty unit of work succeeds")
	require.Equal(t, before, client.requests.Load(), "an empty unit of work makes no request")

	// At the limit it commits.
	require.NoError(t, unit(true, dynamostore.MaxEnqueue-1))
	require.Greater(t, client.requests.Load(), before, "the counter sees the store's requests")
	require.Equal(t, dynamostore.MaxEnqueue-1, pendingCount(t, s))
	out, err = client.Client.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String("outbox"), Key: app.Put.Item})
	require.NoError(t, err)
	require.NotEmpty(t, out.Item, "the application's item is written with the messages")
}

// TestLargeUnitOfWorkIsAllOrNothing: a unit of work far beyond one statement's bind
// parameter limit either commits every message or none.
func TestLargeUnitOfWorkIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	pool := postgresPool(t, 4)
	s, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: uniqueTable("big")})
	s = migrated(t, s, err)
	ob := newSender(t, s, outbox.SenderConfig{})
	const n = 6000 // over PostgreSQL's 65,535 bind parameters at a dozen columns a row
	send := func(fail bool) error {
		return s.Transact(ctx, func(ctx context.Context) error {
			for i := range n {
				if err := ob.Send(ctx, outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "k%d", i%50), Payload: []byte("p")}); err != nil {
					return err
				}
			}
			if fail {
				return errRolledBack
			}
			return nil
		})
	}
	require.ErrorIs(t, send(true), errRolledBack)
	require.Zero(t, pendingCount(t, s))
	require.NoError(t, send(false))
	require.Equal(t, n, pendingCount(t, s))
}

// utf8Bytes returns a valid UTF-8 string in which every byte value that valid UTF-8
// can hold appears (all but NUL, 0xC0, 0xC1 and 0xF5 to 0xFF).
func utf8Bytes(t *testing.T) string {
	var b strings.Builder
	seen := map[byte]bool{}
	for r := rune(1); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		enc := utf8.AppendRune(nil, r)
		fresh := false
		for _, c := range enc {
			fresh = fresh || !seen[c]
		}
		if fresh {
			for _, c := range enc {
				seen[c] = true
			}
			b.WriteString(string(r))
		}
	}
	for c := range 256 {
		want := c != 0 && c != 0xc0 && c != 0xc1 && c < 0xf5
		require.Equal(t, want, seen[byte(c)], "byte %#x", c)
	}
	return b.String()
}

// TestHeadersOfEveryByteValue: keys, payloads and header values holding each of the
// 256 byte values, header keys holding every byte value valid UTF-8 can hold, nil and
// empty values and repeated keys survive capture, every store, and the relay, byte
// for byte and in order.
func TestHeadersOfEveryByteValue(t *testing.T) {
	var all []byte
	for i := range 256 {
		all = append(all, byte(i))
	}
	headers := []outbox.Header{
		{Key: utf8Bytes(t), Value: all},
		{Key: "nil", Value: nil},
		{Key: "empty", Value: []byte{}},
		{Key: "dup", Value: []byte{0}},
		{Key: "dup", Value: []byte{0xff}},
	}
	for i := range 256 {
		headers = append(headers, outbox.Header{Key: fmt.Sprintf("b%03d", i), Value: []byte{byte(i), byte(255 - i)}})
	}
	onEveryStore(t, func(t *testing.T, s outboxtest.Store) {
		ctx := context.Background()
		ob := newSender(t, s, outbox.SenderConfig{})
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			return ob.Send(ctx, outbox.Message{Topic: "t", Key: all, Payload: all, Headers: headers})
		}))
		rec := outboxtest.NewRecorder()
		d, err := relay.New(s, rec, relay.Config{RelayID: "bytes"})
		require.NoError(t, err)
		res, err := d.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, res.Published)
		got := rec.Messages()[0]
		require.Equal(t, all, got.Key)
		require.Equal(t, all, got.Payload)
		require.Len(t, got.Headers, len(headers), "capture and the Recorder add no header")
		for i, h := range headers {
			require.Equal(t, h.Key, got.Headers[i].Key, "header %d key", i)
			require.Equal(t, h.Value == nil, got.Headers[i].Value == nil, "header %d nil-ness", i)
			require.True(t, bytes.Equal(h.Value, got.Headers[i].Value), "header %d value", i)
		}
	})
}
