package quickstart_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/quickstart"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// The README shows Example's body, word for word.
func TestReadmeShowsTheQuickStart(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	body := string(src)
	body = body[strings.Index(body, "func Example() {\n")+len("func Example() {\n"):]
	body = body[:strings.Index(body, "\n}\n")+1]
	body = strings.ReplaceAll("\n"+body, "\n\t", "\n")[1:]
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), body, "README.md's quick start must be Example's body, one tab less")
}

// The quick start's program against real PostgreSQL and an in-process Kafka: the same
// OrderService that the memory-store test runs.
func TestQuickStart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if err := pool.Ping(ctx); err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	suffix := strings.ReplaceAll(uuid.NewString()[:8], "-", "")
	table, orders := "qs_outbox_"+suffix, "qs_orders_"+suffix
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: table})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(ctx))
	_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id text PRIMARY KEY, amount int NOT NULL)`, orders))
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, tbl := range []string{orders, table, table + "_leases", table + "_relays"} {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+tbl)
		}
	})

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "order-placed"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(client.Close)
	transport, err := kafkatransport.New(client, kafkatransport.Config{})
	require.NoError(t, err)

	relayCtx, stopRelay := context.WithCancel(ctx)
	relay, err := relay.New(store, transport, relay.Config{})
	require.NoError(t, err)
	require.NoError(t, relay.Start(relayCtx))

	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
	require.NoError(t, err)
	svc := quickstart.NewOrderService(store, sender, quickstart.PgOrders{
		Insert: fmt.Sprintf(`INSERT INTO %s (id, amount) VALUES ($1, $2)`, orders),
	})

	require.ErrorIs(t, svc.Place(ctx, quickstart.Order{ID: "declined"}), quickstart.ErrDeclined)
	require.NoError(t, svc.Place(ctx, quickstart.Order{ID: "order-7", Amount: 30}))

	var ids []string
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT array_agg(id) FROM %s`, orders)).Scan(&ids))
	require.Equal(t, []string{"order-7"}, ids, "the declined order's row rolled back")

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics("order-placed"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer consumer.Close()
	fetches := consumer.PollRecords(ctx, 10)
	require.NoError(t, fetches.Err())
	records := fetches.Records()
	require.Len(t, records, 1, "one message: the declined order's send rolled back")
	msg, err := kafkatransport.Decode(records[0])
	require.NoError(t, err)
	require.Equal(t, "order-7", string(msg.Key))
	_, ok := msg.Header(outbox.HeaderIdempotencyKey)
	require.True(t, ok, "the transport stamps the idempotency key")

	// defer relay.Stop(ctx) with the signal ctx: cancelled by the time Stop runs, and
	// still the leases go back at once.
	stopRelay()
	_ = relay.Stop(relayCtx)
	view, err := store.Driver().ReadCoordination(context.Background())
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "bucket %d is handed back on Stop", l.Bucket)
	}
}
