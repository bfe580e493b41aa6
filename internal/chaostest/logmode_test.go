package chaostest

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// TestLogModeToKafka: the SQL store's log mode end to end, on a PostgreSQL cluster of
// the test's own with wal_level=logical, to Kafka (kfake) through the Kafka transport:
// no row is written, every committed message arrives once or more, rolled-back units
// never, and each key's first deliveries are in commit order.
func TestLogModeToKafka(t *testing.T) {
	c := pgcluster.Start(t, pgcluster.Logical)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer pool.Close()
	quiet := slog.New(slog.DiscardHandler)
	s, err := sqlstore.NewPgx(pool, sqlstore.Config{Mode: sqlstore.LogMode, Logger: quiet})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	defer s.Close()

	const topic, keys, perKey = "orders", 8, 50
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, topic))
	require.NoError(t, err)
	defer cluster.Close()
	client, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	require.NoError(t, err)
	defer client.Close()
	tr, err := kafkatransport.New(client, kafkatransport.Config{})
	require.NoError(t, err)
	r, err := relay.New(s, tr, relay.Config{Logger: quiet, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	defer func() { _ = r.Stop(context.Background()) }()

	sender, err := outbox.NewSender(s, outbox.SenderConfig{Logger: quiet})
	require.NoError(t, err)
	committed := map[string]bool{}
	for i := range perKey {
		for k := range keys {
			m := outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", k), Payload: fmt.Appendf(nil, "%d:%d", k, i)}
			fail := i%10 == 9 && k == 0 // some units roll back
			err := s.Transact(ctx, func(ctx context.Context) error {
				if err := sender.Send(ctx, m); err != nil {
					return err
				}
				if fail {
					return fmt.Errorf("rolled back")
				}
				return nil
			})
			if !fail {
				require.NoError(t, err)
				committed[string(m.Payload)] = true
			}
		}
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT COUNT(*) FROM "+s.Config().Table).Scan(&rows))
	require.Zero(t, rows, "the fast path writes no row")

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer consumer.Close()
	seen := map[string]bool{}
	last := map[int]int{}
	for len(seen) < len(committed) && ctx.Err() == nil {
		consumer.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			d, err := kafkatransport.Decode(rec)
			require.NoError(t, err)
			p := string(d.Payload)
			require.True(t, committed[p], "only committed messages are delivered: %s", p)
			if seen[p] {
				return
			}
			seen[p] = true
			var k, i int
			_, err = fmt.Sscanf(p, "%d:%d", &k, &i)
			require.NoError(t, err)
			if prev, ok := last[k]; ok {
				require.Greater(t, i, prev, "key k%d: first deliveries in commit order", k)
			}
			last[k] = i
		})
	}
	require.Len(t, seen, len(committed))
}
