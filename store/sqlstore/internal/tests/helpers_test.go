// Package tests holds the tests of package sqlstore that run on a database: the
// store suite and the store's own tests on PostgreSQL (pgx and database/sql),
// MariaDB/MySQL and SQLite, the benchmarks, and the runnable examples on SQLite.
// They live in a package no application imports because go mod tidy also loads the
// tests of the packages an application imports: in package sqlstore, the SQLite
// driver they need would be downloaded by every application that uses the store.
package tests

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/internal/hooks"

	"github.com/outboxkit/outbox/internal/testenv"
)

var (
	postgresURL = testenv.PostgresURL
	mysqlDSN    = testenv.MySQLDSN
	unavailable = testenv.Unavailable
)

// Shared clients: one per server and client kind, opened on first use. Tests isolate
// themselves by table names.
var (
	pgPoolOnce, pgDBOnce, myDBOnce sync.Once
	pgPool                         *pgxpool.Pool
	pgDB, myDB                     *sql.DB
	pgPoolErr, pgDBErr, myDBErr    error
)

func ping(ctx context.Context, db *sql.DB) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

func postgresPool(t testing.TB) *pgxpool.Pool {
	pgPoolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(postgresURL())
		if err != nil {
			pgPoolErr = err
			return
		}
		cfg.MaxConns = 16
		pgPool, pgPoolErr = pgxpool.NewWithConfig(context.Background(), cfg)
		if pgPoolErr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			pgPoolErr = pgPool.Ping(ctx)
		}
	})
	if pgPoolErr != nil {
		unavailable(t, "PostgreSQL", pgPoolErr)
	}
	return pgPool
}

func postgresDB(t testing.TB) *sql.DB {
	pgDBOnce.Do(func() {
		pgDB, pgDBErr = sql.Open("pgx", postgresURL())
		if pgDBErr == nil {
			pgDB.SetMaxOpenConns(16)
			pgDB.SetMaxIdleConns(16) // as docs/stores/sql.md advises for a relay
			pgDBErr = ping(context.Background(), pgDB)
		}
	})
	if pgDBErr != nil {
		unavailable(t, "PostgreSQL", pgDBErr)
	}
	return pgDB
}

func mysqlDB(t testing.TB) *sql.DB {
	myDBOnce.Do(func() {
		myDB, myDBErr = sql.Open("mysql", mysqlDSN())
		if myDBErr == nil {
			myDB.SetMaxOpenConns(16)
			myDB.SetMaxIdleConns(16)
			myDBErr = ping(context.Background(), myDB)
		}
	})
	if myDBErr != nil {
		unavailable(t, "MariaDB/MySQL", myDBErr)
	}
	return myDB
}

// sqliteDSN is the DSN every SQLite test uses: immediate transactions, WAL and a
// busy timeout, so concurrent writers wait for the lock instead of failing.
func sqliteDSN(path string) string {
	return "file:" + path + "?_txlock=immediate&_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
}

func sqliteDB(t testing.TB) *sql.DB {
	db, err := sql.Open("sqlite", sqliteDSN(filepath.Join(t.TempDir(), "outbox.db")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func uniqueTable() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "ob_" + hex.EncodeToString(b)
}

// backend is one database and client kind.
type backend struct {
	name string
	// client is the kind of client the store is built on: "pgx" or "database/sql".
	// (The gorm store is tested in package gormstore.)
	client string
	// build returns a store on the shared client without migrating it.
	build func(t testing.TB, cfg sqlstore.Config) (*sqlstore.Store, error)
	// open builds a store on fresh tables (migrated, dropped in cleanup).
	open func(t testing.TB, cfg sqlstore.Config) *sqlstore.Store
}

// execFunc runs an application statement ('?' placeholders) in the unit of work.
type execFunc func(query string, args ...any) error

// transact runs fn in the store's own unit of work; exec runs an application
// statement in its transaction, reached through the client's accessor.
func (b backend) transact(ctx context.Context, s *sqlstore.Store, fn func(ctx context.Context, exec execFunc) error) error {
	return s.Transact(ctx, func(ctx context.Context) error {
		return fn(ctx, func(q string, args ...any) error { return execInUnit(ctx, s, q, args...) })
	})
}

// execInUnit runs a statement ('?' placeholders) in the unit of work on ctx, through
// PgxTx or SQLTx, whichever the store's client offers.
func execInUnit(ctx context.Context, s *sqlstore.Store, q string, args ...any) error {
	if tx, ok := sqlstore.PgxTx(ctx); ok {
		_, err := tx.Exec(ctx, rebind(q), args...)
		return err
	}
	if tx, ok := sqlstore.SQLTx(ctx); ok {
		if s.Dialect() == sqlstore.PostgreSQL {
			q = rebind(q)
		}
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}
	return errors.New("no unit of work on ctx")
}

func migrated(t testing.TB, s *sqlstore.Store, err error) *sqlstore.Store {
	t.Helper()
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, s.Migrate(ctx))
	t.Cleanup(func() {
		_ = s.Close()
		_ = s.DropTables(context.Background())
	})
	return s
}

func withTable(cfg sqlstore.Config) sqlstore.Config {
	if cfg.Table == "" {
		cfg.Table = uniqueTable()
	}
	return cfg
}

func rebind(q string) string {
	out := make([]byte, 0, len(q)+8)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			out = append(out, '$')
			out = append(out, []byte(itoa(n))...)
			continue
		}
		out = append(out, q[i])
	}
	return string(out)
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

var backends = []backend{
	{
		name: "postgres/pgx", client: "pgx",
		build: func(t testing.TB, cfg sqlstore.Config) (*sqlstore.Store, error) {
			return sqlstore.NewPgx(postgresPool(t), cfg)
		},
	},
	{
		name: "postgres/database-sql", client: "database/sql",
		build: func(t testing.TB, cfg sqlstore.Config) (*sqlstore.Store, error) {
			return sqlstore.NewDB(postgresDB(t), sqlstore.PostgreSQL, cfg)
		},
	},
	{
		name: "mysql/database-sql", client: "database/sql",
		build: func(t testing.TB, cfg sqlstore.Config) (*sqlstore.Store, error) {
			return sqlstore.NewDB(mysqlDB(t), sqlstore.MySQL, cfg)
		},
	},
	{
		name: "sqlite/database-sql", client: "database/sql",
		build: func(t testing.TB, cfg sqlstore.Config) (*sqlstore.Store, error) {
			return sqlstore.NewDB(sqliteDB(t), sqlstore.SQLite, cfg)
		},
	},
}

func init() {
	for i := range backends {
		build := backends[i].build
		backends[i].open = func(t testing.TB, cfg sqlstore.Config) *sqlstore.Store {
			s, err := build(t, withTable(cfg))
			return migrated(t, s, err)
		}
	}
}

// backendNamed returns the backend of that name.
func backendNamed(name string) backend {
	for _, b := range backends {
		if b.name == name {
			return b
		}
	}
	panic("no backend " + name)
}

// eachBackend runs test once per database and client kind, in parallel.
func eachBackend(t *testing.T, test func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

// eachPostgres runs test on the PostgreSQL backends alone (pgx and database/sql).
func eachPostgres(t *testing.T, test func(t *testing.T, b backend)) {
	for _, b := range backends {
		if strings.HasPrefix(b.name, "postgres/") {
			t.Run(b.name, func(t *testing.T) {
				t.Parallel()
				test(t, b)
			})
		}
	}
}

func newEnvelope(t testing.TB, s driver.Handle, key, payload string) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(newMessage(key, payload), s.Driver().BucketCount())
	require.NoError(t, err)
	return env
}

// newMessage is the message newEnvelope wraps, for the calls that take messages.
func newMessage(key, payload string) outbox.Message {
	return outbox.Message{Topic: "orders", Key: []byte(key), Payload: []byte(payload)}
}

// relaySide is every relay-side interface a store's Driver implements.
type relaySide interface {
	driver.Store
	driver.Admin
	driver.Notifier
	driver.Finder
	driver.Retainer
	inbox.Store
	inbox.Remover
}

// drv returns the store's relay side, for the tests that call it directly.
func drv(s driver.Handle) relaySide { return s.Driver().(relaySide) }

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// splitBatchesAt makes Enqueue split batches every n rows until the test ends.
func splitBatchesAt(t testing.TB, n int) {
	hooks.RowsPerStatement.Store(int64(n))
	t.Cleanup(func() { hooks.RowsPerStatement.Store(0) })
}

func sqlstoreConfig() sqlstore.Config { return sqlstore.Config{} }

// quietLog keeps expected warnings (refused claims, a dropped LISTEN) out of test output.
var quietLog = slog.New(slog.DiscardHandler)

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// capture returns the sender an application would use on s.
func capture(t testing.TB, s outbox.Store, mode outbox.WriteMode) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(s, outbox.SenderConfig{Mode: mode, Logger: quietLog})
	require.NoError(t, err)
	return c
}

// send sends a message on topic "orders" through a Transactional capture on s.
func send(t testing.TB, ctx context.Context, s outbox.Store, key, payload string) {
	t.Helper()
	require.NoError(t, capture(t, s, outbox.Transactional).Send(ctx, outbox.Message{Topic: "orders", Key: []byte(key), Payload: []byte(payload)}))
}
