package chaostest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/glebarez/go-sqlite"
	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	gormpostgres "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/gormstore"
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

func postgresGorm(t testing.TB) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(gormpostgres.Open(postgresURL()), &gorm.Config{Logger: logger.Default.LogMode(logger.Silent)})
	if err == nil {
		var sqlDB *sql.DB
		if sqlDB, err = db.DB(); err == nil {
			t.Cleanup(func() { _ = sqlDB.Close() })
			sqlDB.SetMaxOpenConns(8)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			err = sqlDB.PingContext(ctx)
		}
	}
	if err != nil {
		unavailable(t, "PostgreSQL", err)
	}
	return db
}

// sqlKind is one SQL database on one client, for the tests that run on every SQL
// store.
type sqlKind struct {
	name string
	// open returns a store on fresh table names, not migrated, and a *sql.DB on the
	// same database for the test's own statements.
	open func(t *testing.T) (*sqlstore.Store, *sql.DB)
}

func sqlKinds() []sqlKind {
	table := func() sqlstore.Config { return sqlstore.Config{Table: uniqueTable("bad")} }
	return []sqlKind{
		{"postgres/pgx", func(t *testing.T) (*sqlstore.Store, *sql.DB) {
			pool := postgresPool(t, 4)
			s, err := sqlstore.NewPgx(pool, table())
			require.NoError(t, err)
			db := stdlib.OpenDBFromPool(pool)
			t.Cleanup(func() { _ = db.Close() })
			return s, db
		}},
		{"postgres/gorm", func(t *testing.T) (*sqlstore.Store, *sql.DB) {
			g := postgresGorm(t)
			s, err := gormstore.New(g, table())
			require.NoError(t, err)
			db, err := g.DB()
			require.NoError(t, err)
			return s, db
		}},
		{"mariadb", func(t *testing.T) (*sqlstore.Store, *sql.DB) {
			db := mysqlDB(t)
			s, err := sqlstore.NewDB(db, sqlstore.MySQL, table())
			require.NoError(t, err)
			return s, db
		}},
		{"sqlite", func(t *testing.T) (*sqlstore.Store, *sql.DB) {
			db := sqliteDB(t)
			s, err := sqlstore.NewDB(db, sqlstore.SQLite, table())
			require.NoError(t, err)
			return s, db
		}},
	}
}

// storeKind is one store, for the tests that run on every store.
type storeKind struct {
	name string
	// open returns a fresh, empty store with the default bucket count, ready to use.
	open func(t *testing.T) outboxtest.Store
}

func everyStore() []storeKind {
	kinds := []storeKind{{"memory", func(t *testing.T) outboxtest.Store {
		s, err := memstore.New(memstore.Config{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}}
	for _, k := range sqlKinds() {
		kinds = append(kinds, storeKind{k.name, func(t *testing.T) outboxtest.Store {
			s, _ := k.open(t)
			return migrated(t, s, nil)
		}})
	}
	return append(kinds, storeKind{"dynamodb", func(t *testing.T) outboxtest.Store {
		client := dynamoClient(t)
		cfg := dynamostore.Config{TableName: "outbox"}
		require.NoError(t, dynamostore.CreateIfNotExists(context.Background(), client, cfg))
		s, err := dynamostore.New(client, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}})
}

// onEveryStore runs test on a fresh store of every kind.
func onEveryStore(t *testing.T, test func(t *testing.T, s outboxtest.Store)) {
	for _, k := range everyStore() {
		t.Run(k.name, func(t *testing.T) { test(t, k.open(t)) })
	}
}

// execInUnit runs an application statement in the SQL transaction of the unit of
// work on ctx, through the accessor of the store's client.
func execInUnit(ctx context.Context, query string) error {
	if tx, ok := sqlstore.PgxTx(ctx); ok {
		_, err := tx.Exec(ctx, query)
		return err
	}
	if tx, ok := gormstore.Tx(ctx); ok {
		return tx.Exec(query).Error
	}
	if tx, ok := sqlstore.SQLTx(ctx); ok {
		_, err := tx.ExecContext(ctx, query)
		return err
	}
	return errors.New("no SQL transaction on ctx: call it inside Store.Transact")
}
