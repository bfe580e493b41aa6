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

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/store/sqlstore"
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
		// The log mode: PostgreSQL only, and its settings only with -log-mode; nothing
		// is connected to before the flags are checked.
		{Options{DSN: sqlite, LogMode: true}, "-log-mode is for PostgreSQL stores"},
		{Options{DSN: "mysql://root@tcp(127.0.0.1:1)/test", Publication: "p"}, "-publication is for PostgreSQL stores"},
		{Options{DSN: "dynamodb://outbox", Region: "us-east-1", Slot: "s"}, "-slot is for PostgreSQL stores"},
		{Options{DSN: "postgres://127.0.0.1:1/x", Slot: "s"}, "-slot is a setting of the log mode: add -log-mode"},
		{Options{DSN: "postgres://127.0.0.1:1/x", Publication: "p"}, "-publication is a setting of the log mode"},
		{Options{DSN: "postgres://127.0.0.1:1/x", ReplicationURL: "postgres://127.0.0.1:1/x"}, "-replication-url is a setting of the log mode"},
		{Options{DSN: "postgres://127.0.0.1:1/x", LogMode: true, Slot: "Orders-Slot"}, `-slot "Orders-Slot"`},
		{Options{DSN: "postgres://127.0.0.1:1/x", LogMode: true, Publication: "1pub"}, `-publication "1pub"`},
		{Options{DSN: "postgres://127.0.0.1:1/x", LogMode: true, ReplicationURL: "postgres://app:hunter2@[::1"}, "-replication-url: not a PostgreSQL URL"},
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

// -log-mode opens a PostgreSQL store in the log mode, with the store's default slot
// and publication or those of -slot and -publication; its relay side has a stream,
// and StreamLease reads who holds the stream's lease.
func TestLogMode(t *testing.T) {
	c := pgcluster.Start(t, pgcluster.Logical)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := c.URL("postgres")

	st, err := Open(ctx, Options{DSN: dsn, LogMode: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	cfg := st.SQL.Config()
	if cfg.Mode != sqlstore.LogMode || cfg.Slot != "outbox_messages_slot" || cfg.Publication != "outbox_messages_pub" {
		t.Fatalf("-log-mode: mode %v, slot %q, publication %q; want the log mode with the defaults", cfg.Mode, cfg.Slot, cfg.Publication)
	}
	if _, ok := st.Store.(driver.Streamer); !ok {
		t.Fatal("a store in log mode offers its stream to the relay")
	}
	if _, found, err := st.StreamLease(ctx); err != nil || found {
		t.Fatalf("before migrating: stream lease found %t, %v", found, err)
	}
	if err := st.SQL.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.SQL.DropTables(context.Background()) })
	if _, found, err := st.StreamLease(ctx); err != nil || found {
		t.Fatalf("no relay took the stream: stream lease found %t, %v", found, err)
	}

	// A relay takes the stream, then hands it back.
	now := time.Now().Truncate(time.Microsecond)
	claimed, err := st.Claim(ctx, driver.StreamLease, "relay-a", now, now.Add(30*time.Second))
	if err != nil || !claimed {
		t.Fatalf("claim the stream lease: %t, %v", claimed, err)
	}
	lease, found, err := st.StreamLease(ctx)
	if err != nil || !found || lease.Owner != "relay-a" || !lease.ExpiresAt.Equal(now.Add(30*time.Second)) || lease.Bucket != driver.StreamLease {
		t.Fatalf("stream lease %+v, found %t, %v; want relay-a's, expiring in 30 s", lease, found, err)
	}
	if ok, err := st.Release(ctx, lease); err != nil || !ok {
		t.Fatalf("release: %t, %v", ok, err)
	}
	if lease, found, err = st.StreamLease(ctx); err != nil || !found || !lease.Free(time.Now()) {
		t.Fatalf("after release: %+v, found %t, %v; want a free lease", lease, found, err)
	}

	// -slot, -publication and -replication-url reach the store.
	named, err := Open(ctx, Options{DSN: dsn, Table: "orders_outbox", LogMode: true, Slot: "orders_slot", Publication: "orders_pub", ReplicationURL: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = named.Close() })
	cfg = named.SQL.Config()
	if cfg.Slot != "orders_slot" || cfg.Publication != "orders_pub" || cfg.ReplicationURL != dsn {
		t.Fatalf("slot %q, publication %q, replication URL %q: want the flags'", cfg.Slot, cfg.Publication, cfg.ReplicationURL)
	}
	if err := named.SQL.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = named.SQL.DropTables(context.Background()) })
	var slots []string
	rows, err := named.pool.Query(ctx, "SELECT slot_name FROM pg_replication_slots ORDER BY slot_name")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	rows.Close()
	if strings.Join(slots, ",") != "orders_slot,outbox_messages_slot" {
		t.Fatalf("slots %v: want each store's", slots)
	}

	// Without -log-mode: the table mode, no stream.
	table, err := Open(ctx, Options{DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = table.Close() })
	if _, ok := table.Store.(driver.Streamer); ok || table.SQL.Config().Mode != sqlstore.TableMode {
		t.Fatal("a store opened without -log-mode is in the table mode, without a stream")
	}
	if _, found, err := table.StreamLease(ctx); err != nil || found {
		t.Fatalf("table mode: stream lease found %t, %v", found, err)
	}
}
