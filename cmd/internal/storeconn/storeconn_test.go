package storeconn

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/testenv"
)

// Settings a program cannot use fail Open with ErrUsage and a message that names
// the flag, never a Go field, and never prints a password.
func TestOpenNamesTheFlag(t *testing.T) {
	sqlite := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	for _, tc := range []struct {
		opts  Options
		names string
	}{
		{Options{}, "-store"},
		{Options{DSN: sqlite, Table: "bad-name"}, `-table "bad-name"`},
		{Options{DSN: sqlite, Table: "a.b.c"}, "at most one schema qualifier"},
		{Options{DSN: sqlite, Table: strings.Repeat("t", 60)}, "TABLE_migrations"},
		{Options{DSN: sqlite, Buckets: -1}, "-buckets -1"},
		{Options{DSN: "postgres://app:hunter2@[::1"}, "-store: not a PostgreSQL URL"},
		{Options{DSN: "mysql://root@localhost/test"}, "-store: after mysql://"},
		{Options{DSN: "sqlite:"}, "sqlite:PATH"},
		{Options{DSN: "dynamodb://x", Region: "us-east-1"}, `-store "dynamodb://x": a DynamoDB table name`},
		{Options{DSN: "dynamodb://outbox/extra", Region: "us-east-1"}, "dynamodb://TABLE"},
		{Options{DSN: "dynamodb://outbox", Region: "us-east-1", Table: "t"}, "-table is for SQL stores"},
		{Options{DSN: "dynamodb://outbox", Region: "us-east-1", Endpoint: "localhost:8000"}, `-aws-endpoint "localhost:8000"`},
		{Options{DSN: "redis://x"}, "the scheme must be"},
	} {
		st, err := Open(context.Background(), tc.opts)
		if err == nil {
			_ = st.Close()
			t.Fatalf("Open(%+v) succeeded", tc.opts)
		}
		if !errors.Is(err, ErrUsage) {
			t.Errorf("Open(%+v): %v does not wrap ErrUsage", tc.opts, err)
		}
		for _, bad := range []string{"Config.", "hunter2"} {
			if strings.Contains(err.Error(), bad) {
				t.Errorf("Open(%+v): %q contains %q", tc.opts, err, bad)
			}
		}
		if !strings.Contains(err.Error(), tc.names) {
			t.Errorf("Open(%+v): %q does not say %q", tc.opts, err, tc.names)
		}
	}
}

// sqlStores are the SQL stores the tests run on, each with a table of its own; the
// servers that are not there are skipped (or, under CI=true, fail).
func sqlStores(t *testing.T) map[string]Options {
	t.Helper()
	table := fmt.Sprintf("storeconn_%08x", rand.Uint32())
	out := map[string]Options{"sqlite": {DSN: "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")}}
	for name, dsn := range map[string]string{"postgres": testenv.PostgresURL(), "mariadb": "mysql://" + testenv.MySQLDSN()} {
		st, err := Open(context.Background(), Options{DSN: dsn, Table: table})
		if err != nil {
			t.Run(name, func(t *testing.T) { testenv.Unavailable(t, name, err) })
			continue
		}
		_ = st.Close()
		out[name] = Options{DSN: dsn, Table: table}
	}
	return out
}

func TestRecordedBucketCountAndMigrations(t *testing.T) {
	ctx := context.Background()
	for name, opts := range sqlStores(t) {
		t.Run(name, func(t *testing.T) {
			st, err := Open(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = st.SQL.DropTables(context.Background())
				_ = st.Close()
			})
			// Never migrated: nothing recorded, no migration, and no error.
			rec, err := st.RecordedBucketCount(ctx)
			if err != nil || rec != (Recorded{}) {
				t.Fatalf("before migrating: %+v, %v", rec, err)
			}
			ms, err := st.Migrations(ctx)
			if err != nil || len(ms) != 0 {
				t.Fatalf("before migrating: migrations %v, %v", ms, err)
			}

			// Migrated for 16 buckets: a store opened with the default count reads 16.
			sixteen := opts
			sixteen.Buckets = 16
			mig, err := Open(ctx, sixteen)
			if err != nil {
				t.Fatal(err)
			}
			before := time.Now().Add(-time.Minute)
			if err := mig.SQL.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			_ = mig.Close()
			rec, err = st.RecordedBucketCount(ctx)
			want := "table " + st.SQL.Config().Table + "_settings"
			if err != nil || rec.Count != 16 || rec.Source != want {
				t.Fatalf("after migrating for 16 buckets: %+v, %v; want 16 from %q", rec, err, want)
			}
			if st.BucketCount() != 8 {
				t.Fatalf("the store was opened with the default count, has %d", st.BucketCount())
			}

			ms, err = st.Migrations(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) < 4 {
				t.Fatalf("migrations %v: want versions 1 to 4 at least", ms)
			}
			for i, m := range ms {
				if m.Version != i+1 {
					t.Errorf("migration %d has version %d: want them in order from 1", i, m.Version)
				}
				if m.AppliedAt.Before(before) || m.AppliedAt.After(time.Now().Add(time.Minute)) || m.AppliedAt.Location() != time.UTC {
					t.Errorf("migration %d applied at %s: want now, in UTC", m.Version, m.AppliedAt)
				}
			}
		})
	}
}
