package chaostest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/internal/testenv"
)

var (
	postgresURL = testenv.PostgresURL
	mysqlDSN    = testenv.MySQLDSN
	unavailable = testenv.Unavailable
)

func postgresPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(postgresURL())
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err = pool.Ping(ctx)
	}
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func mysqlDB(t testing.TB) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", mysqlDSN())
	require.NoError(t, err)
	db.SetMaxOpenConns(24)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		unavailable(t, "MariaDB", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func sqliteDB(t testing.TB) *sql.DB {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outbox.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_txlock=immediate&_pragma=busy_timeout(20000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func uniqueTable(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "_" + hex.EncodeToString(b)
}
