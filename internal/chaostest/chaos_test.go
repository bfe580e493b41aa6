package chaostest

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/chaos"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// large reports whether the large runs were asked for.
func large() bool { return os.Getenv("OUTBOX_CHAOS_LARGE") == "1" }

// chaosConfig is the run every store gets: CI-sized by default, 100,000 messages with
// OUTBOX_CHAOS_LARGE=1.
func chaosConfig() chaos.Config {
	if large() {
		return chaos.Config{
			Messages:     100_000,
			Keys:         512,
			Writers:      8,
			UnitSize:     8,
			Relays:       6,
			BucketCount:  32,
			BatchSize:    100,
			DrainTimeout: 5 * time.Minute,
			Faults: chaos.Schedule{
				Duration:      20 * time.Second,
				GracefulStops: 3,
				Crashes:       2,
			},
		}
	}
	return chaos.Config{Messages: 3000, Faults: chaos.Schedule{Duration: 4 * time.Second}}
}

// verify adds the checks every store's run must pass beyond the harness's own.
func verify(t *testing.T, rep chaos.Report, cfg chaos.Config) {
	t.Helper()
	require.Equal(t, cfg.Messages, rep.Committed+rep.RolledBack)
	require.Positive(t, rep.RolledBack)
	require.Positive(t, rep.InjectedErrors)
	require.Positive(t, rep.Crashes)
	require.Positive(t, rep.GracefulStops)
	require.Zero(t, rep.Parked)
}

func TestChaosMemory(t *testing.T) {
	rep := chaos.Run(t, outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outboxtest.Store {
			s, err := memstore.New(memstore.Config{BucketCount: bucketCount})
			require.NoError(t, err)
			return s
		},
		// No Transact: the writers use the store's own unit of work.
	}, chaosConfig())
	verify(t, rep, chaosConfig())
}

// migrated migrates a store on fresh tables and drops them at cleanup.
func migrated(t *testing.T, s *sqlstore.Store, err error) *sqlstore.Store {
	t.Helper()
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	t.Cleanup(func() { _ = s.DropTables(context.Background()) })
	return s
}

func TestChaosPostgresPgx(t *testing.T) {
	pool := postgresPool(t, 32)
	cfg := chaosConfig()
	cfg.Reopen = reopenSQL
	rep := chaos.Run(t, outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outboxtest.Store {
			s, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: uniqueTable("chaos"), BucketCount: bucketCount})
			return migrated(t, s, err)
		},
		Transact: func(ctx context.Context, s outboxtest.Store, fn func(ctx context.Context) error) error {
			return s.Transact(ctx, func(ctx context.Context) error {
				// The application's own write, in the same transaction.
				tx, ok := sqlstore.PgxTx(ctx)
				if !ok {
					return errors.New("no pgx transaction inside the unit of work")
				}
				if _, err := tx.Exec(ctx, "select 1"); err != nil {
					return err
				}
				return fn(ctx)
			})
		},
	}, cfg)
	verify(t, rep, cfg)
}

// reopenSQL opens another store on the same client and tables, as a relay in another
// process would.
func reopenSQL(t *testing.T, s outboxtest.Store) outboxtest.Store {
	st := s.(*sqlstore.Store)
	cfg := st.Config()
	var (
		pool *pgxpool.Pool
		db   *sql.DB
		err  error
		out  *sqlstore.Store
	)
	switch {
	case st.As(&pool):
		out, err = sqlstore.NewPgx(pool, cfg)
	case st.As(&db):
		out, err = sqlstore.NewDB(db, st.Dialect(), cfg)
	default:
		t.Fatalf("cannot reopen a %s store", st.Dialect())
	}
	require.NoError(t, err)
	return out
}

func sqlHarness(db func(t *testing.T) *sql.DB, dialect sqlstore.Dialect) outboxtest.StoreHarness {
	return outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outboxtest.Store {
			s, err := sqlstore.NewDB(db(t), dialect, sqlstore.Config{Table: uniqueTable("chaos"), BucketCount: bucketCount})
			return migrated(t, s, err)
		},
		Transact: func(ctx context.Context, s outboxtest.Store, fn func(ctx context.Context) error) error {
			return s.Transact(ctx, func(ctx context.Context) error {
				tx, ok := sqlstore.SQLTx(ctx)
				if !ok {
					return errors.New("no *sql.Tx inside the unit of work")
				}
				if _, err := tx.ExecContext(ctx, "select 1"); err != nil {
					return err
				}
				return fn(ctx)
			})
		},
	}
}

// separateProcesses is the run for a store several processes share: every relay on
// its own handle.
func separateProcesses() chaos.Config {
	cfg := chaosConfig()
	cfg.Reopen = reopenSQL
	return cfg
}

func TestChaosMariaDB(t *testing.T) {
	verify(t, chaos.Run(t, sqlHarness(func(t *testing.T) *sql.DB { return mysqlDB(t) }, sqlstore.MySQL), separateProcesses()), separateProcesses())
}

func TestChaosSQLite(t *testing.T) {
	verify(t, chaos.Run(t, sqlHarness(func(t *testing.T) *sql.DB { return sqliteDB(t) }, sqlstore.SQLite), separateProcesses()), separateProcesses())
}
