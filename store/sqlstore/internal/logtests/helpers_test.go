// Package logtests holds the tests of the SQL store's log mode (Config.Mode LogMode):
// they run on a PostgreSQL cluster of their own with wal_level=logical, started once
// for the package (the shared server's settings are never changed).
package logtests

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/store/sqlstore"
)

var (
	cluster    *pgcluster.Cluster
	clusterErr error
	pool       *pgxpool.Pool
	db         *sql.DB
)

func TestMain(m *testing.M) {
	cluster, clusterErr = pgcluster.New(pgcluster.Logical)
	if clusterErr == nil {
		pool, clusterErr = pgxpool.New(context.Background(), cluster.URL("postgres")+"&pool_max_conns=24")
	}
	if clusterErr == nil {
		db, clusterErr = sql.Open("pgx", cluster.URL("postgres"))
		db.SetMaxOpenConns(24)
		db.SetMaxIdleConns(24)
	}
	code := m.Run()
	if pool != nil {
		pool.Close()
	}
	if db != nil {
		_ = db.Close()
	}
	if cluster != nil {
		cluster.Remove()
	}
	os.Exit(code)
}

// need skips (or, under CI=true, fails) a test when the cluster could not start.
func need(t testing.TB) {
	t.Helper()
	if clusterErr == nil {
		return
	}
	if os.Getenv("CI") == "true" || !errors.Is(clusterErr, pgcluster.ErrNoPostgres) {
		t.Fatalf("a PostgreSQL cluster of the tests' own with wal_level=logical is required: %v", clusterErr)
	}
	t.Skipf("no PostgreSQL cluster of the tests' own (%v); install PostgreSQL 14 or later to run this test", clusterErr)
}

var quietLog = slog.New(slog.DiscardHandler)

func uniqueTable() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "lg_" + hex.EncodeToString(b)
}

// client is one way to reach the cluster.
type client struct {
	name  string
	build func(cfg sqlstore.Config) (*sqlstore.Store, error)
}

var clients = []client{
	{"pgx", func(cfg sqlstore.Config) (*sqlstore.Store, error) { return sqlstore.NewPgx(pool, cfg) }},
	{"database-sql", func(cfg sqlstore.Config) (*sqlstore.Store, error) {
		return sqlstore.NewDB(db, sqlstore.PostgreSQL, cfg)
	}},
}

func eachClient(t *testing.T, test func(t *testing.T, c client)) {
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			test(t, c)
		})
	}
}

// open builds a log-mode store on fresh tables, migrated (slot and publication
// included) and dropped at the end.
func open(t testing.TB, c client, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	need(t)
	if cfg.Table == "" {
		cfg.Table = uniqueTable()
	}
	cfg.Mode = sqlstore.LogMode
	if cfg.Logger == nil {
		cfg.Logger = quietLog
	}
	s, err := c.build(cfg)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(testContext(t)))
	t.Cleanup(func() {
		_ = s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// A reader that has not let go of the slot yet holds it for a moment.
		for range 50 {
			if err := s.DropTables(ctx); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return s
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func countRows(t testing.TB, s *sqlstore.Store) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), "SELECT COUNT(*) FROM "+s.Config().Table).Scan(&n))
	return n
}

func sender(t testing.TB, s outbox.Store, mode outbox.WriteMode) outbox.Sender {
	t.Helper()
	snd, err := outbox.NewSender(s, outbox.SenderConfig{Mode: mode, Logger: quietLog})
	require.NoError(t, err)
	return snd
}

func message(key string, i int) outbox.Message {
	return outbox.Message{Topic: "orders", Key: []byte(key), Payload: fmt.Appendf(nil, "%s-%d", key, i)}
}

// openStream opens the store's stream and closes it at the end.
func openStream(t testing.TB, s *sqlstore.Store) driver.Stream {
	t.Helper()
	ctx := testContext(t)
	st, err := s.Driver().(driver.Streamer).OpenStream(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close(context.Background()) })
	return st
}

// readN reads n envelopes from st, confirming nothing, and returns them with the
// position past the last batch.
func readN(t testing.TB, st driver.Stream, n int) ([]*driver.Envelope, driver.StreamPosition) {
	t.Helper()
	ctx := testContext(t)
	var out []*driver.Envelope
	var pos driver.StreamPosition
	for len(out) < n {
		envs, p, err := st.Next(ctx)
		require.NoError(t, err)
		if len(envs) > 0 {
			require.Greater(t, p, pos, "positions move forward")
			pos = p
		}
		out = append(out, envs...)
	}
	require.Len(t, out, n)
	return out, pos
}

// requireQuiet checks st hands out nothing more during one idle wait.
func requireQuiet(t testing.TB, st driver.Stream) {
	t.Helper()
	envs, _, err := st.Next(testContext(t))
	require.NoError(t, err)
	require.Empty(t, envs)
}
