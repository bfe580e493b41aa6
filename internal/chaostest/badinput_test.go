package chaostest

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	ddbtypes "github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/dispatcher"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/outboxtest"
	dynamodb "github.com/outboxkit/outbox/store/dynamodb"
	"github.com/outboxkit/outbox/store/memory"
	sqlstore "github.com/outboxkit/outbox/store/sql"
	"github.com/outboxkit/outbox/transport/kafka"
	sqstransport "github.com/outboxkit/outbox/transport/sqs"
)

// pendingCount counts what a store holds in any status.
func pendingCount(t *testing.T, s outbox.DispatchStore) int {
	t.Helper()
	n := 0
	for b := range s.BucketCount() {
		envs, err := s.Fetch(context.Background(), b, 100_000)
		require.NoError(t, err)
		n += len(envs)
	}
	if admin, ok := s.(outbox.Admin); ok {
		parked, err := admin.List(context.Background(), outbox.Parked, outbox.Cursor{}, 100_000)
		require.NoError(t, err)
		n += len(parked)
	}
	return n
}

func sqliteStore(t *testing.T, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = uniqueTable("bad")
	}
	s, err := sqlstore.NewDB(sqliteDB(t), sqlstore.SQLite, cfg)
	return migrated(t, s, err)
}

// TestOversizedRejectedAtCapture: a message over the store's limit, or over the
// transport's limit passed to capture, fails at Send with ErrTooLarge, in both write
// modes, and nothing (not even the rest of the unit of work) is written.
func TestOversizedRejectedAtCapture(t *testing.T) {
	ctx := context.Background()
	big := outbox.Message{Topic: "t", Key: []byte("k"), Payload: bytes.Repeat([]byte{0xff}, 2000)}
	small := outbox.Message{Topic: "t", Key: []byte("k"), Payload: []byte("ok")}

	t.Run("store limit/memory", func(t *testing.T) {
		s, err := memory.New(memory.Config{MaxMessageSize: 1000})
		require.NoError(t, err)
		ob, err := middleware.NewOutbox(s, middleware.Config{})
		require.NoError(t, err)
		err = ob.Send(ctx, big)
		require.ErrorIs(t, err, outbox.ErrTooLarge)
		require.Contains(t, err.Error(), "nothing was written")
		require.Zero(t, pendingCount(t, s))
	})
	t.Run("store limit/sqlite unit of work", func(t *testing.T) {
		s := sqliteStore(t, sqlstore.Config{MaxMessageSize: 1000})
		ob, err := middleware.NewOutbox(s, middleware.Config{Mode: outbox.Transactional})
		require.NoError(t, err)
		uctx, scope := outbox.NewScope(ctx)
		defer scope.Release()
		err = s.Transact(uctx, nil, func(ctx context.Context, tx *sql.Tx) error {
			require.NoError(t, ob.Send(ctx, small))
			return ob.Send(ctx, big)
		})
		require.ErrorIs(t, err, outbox.ErrTooLarge)
		require.Zero(t, pendingCount(t, s), "the unit of work must write nothing")
	})
	t.Run("store limit/dynamodb unit of work", func(t *testing.T) {
		client := dynamoClient(t)
		opts := dynamodb.Options{TableName: "outbox"}
		require.NoError(t, dynamodb.CreateIfNotExists(ctx, client, opts))
		s, err := dynamodb.New(client, opts)
		require.NoError(t, err)
		ob, err := middleware.NewOutbox(s, middleware.Config{Mode: outbox.Transactional})
		require.NoError(t, err)
		huge := outbox.Message{Topic: "t", Key: []byte("k"), Payload: bytes.Repeat([]byte{1}, s.MaxMessageSize()+1)}
		uctx, scope := outbox.NewScope(ctx)
		defer scope.Release()
		err = s.Transact(uctx, func(ctx context.Context) ([]ddbtypes.TransactWriteItem, error) {
			require.NoError(t, ob.Send(ctx, small))
			return nil, ob.Send(ctx, huge)
		})
		require.ErrorIs(t, err, outbox.ErrTooLarge)
		require.Zero(t, pendingCount(t, s), "the unit of work must write nothing")
	})
	t.Run("transport limit/sqs", func(t *testing.T) {
		// The transport never dials at construction; its limit is what capture needs.
		tr, err := sqstransport.New(awssqs.New(awssqs.Options{Region: "us-east-1"}), sqstransport.Config{MaxBytes: 2048})
		require.NoError(t, err)
		s, err := memory.New(memory.Config{})
		require.NoError(t, err)
		ob, err := middleware.NewOutbox(s, middleware.Config{MaxMessageSize: tr.MaxMessageSize()})
		require.NoError(t, err)
		require.Less(t, tr.MaxMessageSize(), 2048, "the limit leaves room for the attributes the transport adds")
		over := outbox.Message{Topic: "t", Payload: bytes.Repeat([]byte{'a'}, tr.MaxMessageSize())}
		require.ErrorIs(t, ob.Send(ctx, over), outbox.ErrTooLarge)
		require.NoError(t, ob.Send(ctx, small))
		require.Equal(t, 1, pendingCount(t, s))
	})
	t.Run("transport limit/kafka", func(t *testing.T) {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
		require.NoError(t, err)
		defer cluster.Close()
		client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
		require.NoError(t, err)
		defer client.Close()
		tr, err := kafka.New(client, kafka.Config{MaxMessageSize: 1500})
		require.NoError(t, err)
		s, err := memory.New(memory.Config{}) // the store alone would take it
		require.NoError(t, err)
		ob, err := middleware.NewOutbox(s, middleware.Config{MaxMessageSize: tr.MaxMessageSize()})
		require.NoError(t, err)
		require.ErrorIs(t, ob.Send(ctx, big), outbox.ErrTooLarge)
		require.NoError(t, ob.Send(ctx, small))
		require.Equal(t, 1, pendingCount(t, s))
	})
}

// TestInvalidTopicAndRoute: no topic, or a topic with no route, is refused before
// anything is written.
func TestInvalidTopicAndRoute(t *testing.T) {
	ctx := context.Background()
	s, err := memory.New(memory.Config{})
	require.NoError(t, err)
	ob, err := middleware.NewOutbox(s, middleware.Config{})
	require.NoError(t, err)
	router := middleware.NewRouter()
	router.Handle("orders", nil, ob.UseOutbox())

	err = router.Send(ctx, outbox.Message{Topic: "invoices", Payload: []byte("x")})
	require.ErrorIs(t, err, outbox.ErrNoRoute)
	require.Contains(t, err.Error(), "invoices")
	require.ErrorIs(t, ob.Send(ctx, outbox.Message{Payload: []byte("x")}), outbox.ErrInvalidMessage)
	neg := int32(-1)
	require.ErrorIs(t, ob.Send(ctx, outbox.Message{Topic: "orders", Partition: &neg}), outbox.ErrInvalidMessage)
	require.ErrorIs(t, ob.Send(ctx, outbox.Message{Topic: "orders", Headers: []outbox.Header{{Key: "", Value: []byte("v")}}}), outbox.ErrInvalidMessage)
	require.Zero(t, pendingCount(t, s))
	require.Panics(t, func() { router.Handle("", nil, ob.UseOutbox()) }, "an empty topic is a programming error")
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
	s8, err := memory.New(memory.Config{BucketCount: 8})
	require.NoError(t, err)

	env4, err := outbox.NewEnvelope(outbox.Message{Topic: "t", Key: []byte("k")}, 4)
	require.NoError(t, err)
	require.ErrorIs(t, s8.Enqueue(ctx, env4), outbox.ErrMisconfigured, "a store refuses another writer's count")
	require.Zero(t, pendingCount(t, s8))

	_, err = dispatcher.New(s8, outboxtest.NewRecorder(), dispatcher.Config{BucketCount: 4})
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "a relay refuses a store with another count")

	// Two processes configured differently on one table: the writer's store has 4
	// buckets, the relay's 8. The relay stops with ErrMisconfigured; the message stays.
	table := uniqueTable("buckets")
	db := sqliteDB(t)
	writer, err := sqlstore.NewDB(db, sqlstore.SQLite, sqlstore.Config{Table: table, BucketCount: 4})
	writer = migrated(t, writer, err)
	relayStore, err := sqlstore.NewDB(db, sqlstore.SQLite, sqlstore.Config{Table: table, BucketCount: 8})
	require.NoError(t, err)
	env, err := outbox.NewEnvelope(outbox.Message{Topic: "t", Key: []byte("k")}, 4)
	require.NoError(t, err)
	env.Bucket = 1 // a bucket both counts have
	require.NoError(t, writer.Enqueue(ctx, env))

	rec := outboxtest.NewRecorder()
	d, err := dispatcher.New(relayStore, rec, dispatcher.Config{
		BucketCount: 8, PollInterval: 10 * time.Millisecond,
		LeaseDuration: 600 * time.Millisecond, LeaseRenewInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	require.NoError(t, d.Start(ctx))
	select {
	case <-d.Stopped():
	case <-time.After(10 * time.Second):
		_ = d.Stop(ctx)
		t.Fatal("the relay kept running with envelopes of another bucket count")
	}
	require.ErrorIs(t, d.Err(), outbox.ErrMisconfigured)
	require.Zero(t, rec.Len(), "nothing may be published under the wrong count")
	found, err := writer.Find(ctx, env.ID)
	require.NoError(t, err, "the message must still be stored")
	require.Equal(t, outbox.Pending, found.Status)
}

// TestTransactionalSendWithoutScope: no scope, no write, a clear error.
func TestTransactionalSendWithoutScope(t *testing.T) {
	ctx := context.Background()
	s, err := memory.New(memory.Config{})
	require.NoError(t, err)
	ob, err := middleware.NewOutbox(s, middleware.Config{Mode: outbox.Transactional})
	require.NoError(t, err)
	err = ob.Send(ctx, outbox.Message{Topic: "t", Payload: []byte("x")})
	require.ErrorIs(t, err, outbox.ErrNoScope)
	require.Contains(t, err.Error(), "outbox.NewScope")
	require.ErrorIs(t, s.Commit(ctx, nil), outbox.ErrNoScope)
	require.Zero(t, pendingCount(t, s))
}

// TestLargeUnitOfWorkIsAllOrNothing: a unit of work far beyond one statement's bind
// parameter limit either commits every message or none.
func TestLargeUnitOfWorkIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	pool := postgresPool(t, 4)
	s, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: uniqueTable("big")})
	s = migrated(t, s, err)
	ob, err := middleware.NewOutbox(s, middleware.Config{Mode: outbox.Transactional})
	require.NoError(t, err)
	const n = 6000 // over PostgreSQL's 65,535 bind parameters at a dozen columns a row
	send := func(fail bool) error {
		uctx, scope := outbox.NewScope(ctx)
		defer scope.Release()
		return s.TransactPgx(uctx, func(ctx context.Context, tx pgx.Tx) error {
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

// TestHeadersOfEveryByteValue: header keys and values holding each of the 256 byte
// values, nil and empty values, survive capture, every store kind here, and the relay,
// byte for byte and in order.
func TestHeadersOfEveryByteValue(t *testing.T) {
	var all []byte
	for i := range 256 {
		all = append(all, byte(i))
	}
	headers := []outbox.Header{
		{Key: string(all[1:]), Value: all}, // a key cannot be empty; every other byte is fine
		{Key: "\x00", Value: nil},
		{Key: "\xff\xfe", Value: []byte{}},
		{Key: "dup", Value: []byte{0}},
		{Key: "dup", Value: []byte{0xff}},
	}
	for i := range 256 {
		headers = append(headers, outbox.Header{Key: "b" + string(rune('0'+i%10)) + string([]byte{byte(i)}), Value: []byte{byte(i), byte(255 - i)}})
	}
	stores := map[string]func(t *testing.T) (outbox.DispatchStore, func(ctx context.Context, fn func(ctx context.Context) error) error){
		"memory": func(t *testing.T) (outbox.DispatchStore, func(context.Context, func(context.Context) error) error) {
			s, err := memory.New(memory.Config{BucketCount: 1})
			require.NoError(t, err)
			return s, s.Transact
		},
		"sqlite": func(t *testing.T) (outbox.DispatchStore, func(context.Context, func(context.Context) error) error) {
			s := sqliteStore(t, sqlstore.Config{BucketCount: 1})
			return s, func(ctx context.Context, fn func(context.Context) error) error {
				return s.Transact(ctx, nil, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
			}
		},
		"postgres": func(t *testing.T) (outbox.DispatchStore, func(context.Context, func(context.Context) error) error) {
			s, err := sqlstore.NewPgx(postgresPool(t, 2), sqlstore.Config{Table: uniqueTable("bytes"), BucketCount: 1})
			s = migrated(t, s, err)
			return s, func(ctx context.Context, fn func(context.Context) error) error {
				return s.TransactPgx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
			}
		},
		"mariadb": func(t *testing.T) (outbox.DispatchStore, func(context.Context, func(context.Context) error) error) {
			s, err := sqlstore.NewDB(mysqlDB(t), sqlstore.MySQL, sqlstore.Config{Table: uniqueTable("bytes"), BucketCount: 1})
			s = migrated(t, s, err)
			return s, func(ctx context.Context, fn func(context.Context) error) error {
				return s.Transact(ctx, nil, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
			}
		},
	}
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s, transact := open(t)
			ob, err := middleware.NewOutbox(s, middleware.Config{Mode: outbox.Transactional, DisableIdempotencyKey: true})
			require.NoError(t, err)
			uctx, scope := outbox.NewScope(ctx)
			defer scope.Release()
			require.NoError(t, transact(uctx, func(ctx context.Context) error {
				return ob.Send(ctx, outbox.Message{Topic: "t", Key: all, Payload: all, Headers: headers})
			}))
			rec := outboxtest.NewRecorder()
			d, err := dispatcher.New(s, rec, dispatcher.Config{BucketCount: 1, RelayID: "bytes"})
			require.NoError(t, err)
			res, err := d.RunOnce(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, res.Published)
			got := rec.Messages()[0]
			require.Equal(t, all, got.Key)
			require.Equal(t, all, got.Payload)
			require.Len(t, got.Headers, len(headers))
			for i, h := range headers {
				require.Equal(t, h.Key, got.Headers[i].Key, "header %d key", i)
				require.Equal(t, h.Value == nil, got.Headers[i].Value == nil, "header %d nil-ness", i)
				require.True(t, bytes.Equal(h.Value, got.Headers[i].Value), "header %d value", i)
			}
		})
	}
}
