package gormstore_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/stretchr/testify/require"
	gormmysql "gorm.io/driver/mysql"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/gormstore"

	"github.com/outboxkit/outbox/internal/testenv"
)

// Shared server clients, opened on first use; tests isolate themselves by table
// names.
var (
	pgOnce, myOnce sync.Once
	pgGorm, myGorm *gorm.DB
	pgErr, myErr   error
)

// quietGorm returns a fresh config per Open: gorm keeps the pointer and stores the
// connection pool in it.
func quietGorm() *gorm.Config { return &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)} }

// openServer opens gorm on a server and checks it answers.
func openServer(d gorm.Dialector) (*gorm.DB, error) {
	db, err := gorm.Open(d, quietGorm())
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	sqlDB.SetMaxOpenConns(16)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return db, sqlDB.PingContext(ctx)
}

func postgresGorm(t testing.TB) *gorm.DB {
	pgOnce.Do(func() { pgGorm, pgErr = openServer(gormpostgres.Open(testenv.PostgresURL())) })
	if pgErr != nil {
		testenv.Unavailable(t, "PostgreSQL", pgErr)
	}
	return pgGorm
}

func mysqlGorm(t testing.TB) *gorm.DB {
	myOnce.Do(func() { myGorm, myErr = openServer(gormmysql.Open(testenv.MySQLDSN())) })
	if myErr != nil {
		testenv.Unavailable(t, "MariaDB/MySQL", myErr)
	}
	return myGorm
}

// sqliteDSN makes concurrent writers wait for the lock instead of failing.
func sqliteDSN(path string) string {
	return "file:" + path + "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
}

// sqliteGorm opens gorm on a fresh SQLite file; cfg may set gorm options.
func sqliteGorm(t testing.TB, cfg *gorm.Config) *gorm.DB {
	if cfg == nil {
		cfg = quietGorm()
	}
	db, err := gorm.Open(sqlite.Open(sqliteDSN(filepath.Join(t.TempDir(), "outbox.db"))), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

func uniqueTable() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "ob_" + hex.EncodeToString(b)
}

// backend is one database through gorm.
type backend struct {
	name string
	db   func(t testing.TB) *gorm.DB
}

var backends = []backend{
	{"postgres", postgresGorm},
	{"mysql", mysqlGorm},
	{"sqlite", func(t testing.TB) *gorm.DB { return sqliteGorm(t, nil) }},
}

// eachBackend runs test once per database, in parallel.
func eachBackend(t *testing.T, test func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

// open returns a store on db with fresh, migrated tables, dropped in cleanup.
func open(t testing.TB, db *gorm.DB, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	if cfg.Table == "" {
		cfg.Table = uniqueTable()
	}
	s, err := gormstore.New(db, cfg)
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	t.Cleanup(func() {
		_ = s.Close()
		_ = s.DropTables(context.Background())
	})
	return s
}

// businessTable creates an application table beside the outbox tables.
func businessTable(t testing.TB, db *gorm.DB) string {
	name := uniqueTable() + "_orders"
	require.NoError(t, db.Exec("CREATE TABLE "+name+" (id BIGINT NOT NULL PRIMARY KEY, note VARCHAR(100) NOT NULL)").Error)
	t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS " + name).Error })
	return name
}

func countRows(t testing.TB, db *gorm.DB, table string) int {
	t.Helper()
	var n int64
	require.NoError(t, db.Table(table).Count(&n).Error)
	return int(n)
}

// insertOrder writes the application's row through the unit's gorm transaction.
func insertOrder(ctx context.Context, table string, id int, note string) error {
	tx, ok := gormstore.Tx(ctx)
	if !ok {
		return fmt.Errorf("no gorm transaction on ctx")
	}
	return tx.Exec("INSERT INTO "+table+" (id, note) VALUES (?, ?)", id, note).Error
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var quietLog = slog.New(slog.DiscardHandler)

// capture returns the sender an application would use on s.
func capture(t testing.TB, s outbox.Store, mode outbox.WriteMode) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(s, outbox.SenderConfig{Mode: mode, Logger: quietLog})
	require.NoError(t, err)
	return c
}

func orderMsg(id int) outbox.Message {
	return outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", id), Payload: []byte("created")}
}

var modes = []outbox.WriteMode{outbox.Transactional, outbox.Immediate}

// sqlDB returns gorm's *sql.DB.
func sqlDB(t testing.TB, db *gorm.DB) *sql.DB {
	d, err := db.DB()
	require.NoError(t, err)
	return d
}
