package logtests

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// The inbox suite in log mode: the consumer's keys and its effects commit in the
// unit's transaction, and what the consumer sends goes to the log (read back through
// the table lane, as the store suite does).
func TestInboxInLogMode(t *testing.T) {
	need(t)
	effects := func(s *sqlstore.Store) string { return s.Config().Table + "_effects" }
	outboxtest.RunInboxTests(t, outboxtest.InboxHarness{
		New: func(t *testing.T) outboxtest.Store {
			s := open(t, clients[0], sqlstore.Config{BucketCount: 1})
			_, err := pool.Exec(context.Background(), "CREATE TABLE "+effects(s)+" (k VARCHAR(100) NOT NULL)")
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+effects(s)) })
			return lane(t, s)
		},
		Effect: func(ctx context.Context, st outboxtest.Store, key string) error {
			s := st.(laneStore).Store
			tx, ok := sqlstore.PgxTx(ctx)
			require.True(t, ok)
			_, err := tx.Exec(ctx, "INSERT INTO "+effects(s)+" (k) VALUES ($1)", key[:min(len(key), 100)])
			return err
		},
		Effects: func(t *testing.T, st outboxtest.Store, key string) int {
			s := st.(laneStore).Store
			var p *pgxpool.Pool
			require.True(t, s.As(&p))
			var n int
			require.NoError(t, p.QueryRow(context.Background(), "SELECT COUNT(*) FROM "+effects(s)+" WHERE k = $1", key[:min(len(key), 100)]).Scan(&n))
			return n
		},
	})
}
