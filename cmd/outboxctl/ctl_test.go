package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/truora/minidyn/server"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/testenv"
)

// backend is one store the tests run the commands against.
type backend struct {
	name string
	// args are the store flags every command gets.
	args []string
	// setup is the command that creates the tables.
	setup string
}

// backends returns every store, skipping (or, under CI=true, failing) the servers
// that are not there.
func backends(t *testing.T) []backend {
	t.Helper()
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	var out []backend

	out = append(out, backend{name: "sqlite", args: []string{"-store", "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")}, setup: "migrate"})

	pool, err := pgxpool.New(context.Background(), testenv.PostgresURL())
	if err == nil {
		err = pool.Ping(context.Background())
		pool.Close()
	}
	if err == nil {
		out = append(out, backend{name: "postgres", args: []string{"-store", testenv.PostgresURL(), "-table", "ctl_" + suffix}, setup: "migrate"})
	} else {
		reportMissing(t, "PostgreSQL", err)
	}

	db, err := sql.Open("mysql", testenv.MySQLDSN())
	if err == nil {
		err = db.Ping()
		_ = db.Close()
	}
	if err == nil {
		out = append(out, backend{name: "mariadb", args: []string{"-store", "mysql://" + testenv.MySQLDSN(), "-table", "ctl_" + suffix}, setup: "migrate"})
	} else {
		reportMissing(t, "MariaDB", err)
	}

	srv := httptest.NewServer(server.NewServer())
	t.Cleanup(srv.Close)
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	out = append(out, backend{name: "dynamodb", args: []string{"-store", "dynamodb://ctl-" + suffix, "-aws-region", "us-east-1", "-aws-endpoint", srv.URL}, setup: "create-table"})
	return out
}

// reportMissing fails under CI=true and logs otherwise (the other stores still run).
func reportMissing(t *testing.T, what string, err error) {
	t.Helper()
	t.Run(what, func(t *testing.T) { testenv.Unavailable(t, what, err) })
}

// ctl runs outboxctl and returns its exit code, stdout and stderr.
func ctl(t *testing.T, b backend, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	full := append([]string{args[0]}, b.args...)
	full = append(full, args[1:]...)
	code := run(context.Background(), full, &out, &errOut)
	return code, out.String(), errOut.String()
}

// ok runs outboxctl and requires exit code 0.
func ok(t *testing.T, b backend, args ...string) string {
	t.Helper()
	code, out, errOut := ctl(t, b, args...)
	require.Equal(t, 0, code, "outboxctl %v: %s%s", args, out, errOut)
	return out
}

// seed writes pending messages through the store and parks some of them, as a
// relay would; it returns the parked envelopes.
func seed(t *testing.T, st *openedStore, topic string, n, park int) []*driver.Envelope {
	t.Helper()
	ctx := context.Background()
	var envs []*driver.Envelope
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "%s-key-%d", topic, i),
			Payload: fmt.Appendf(nil, `{"n":%d}`, i), Headers: []outbox.Header{{Key: "trace", Value: []byte("t1")}}}, st.BucketCount())
		require.NoError(t, err)
		envs = append(envs, env)
	}
	require.NoError(t, st.Enqueue(ctx, envs...))
	var parked []*driver.Envelope
	for _, e := range envs[:park] {
		fetched, err := st.Fetch(ctx, e.Bucket, 1000)
		require.NoError(t, err)
		for _, f := range fetched.Envelopes {
			if f.ID == e.ID {
				require.NoError(t, st.Park(ctx, f, fmt.Sprintf("broker refused %s: message too large", f.ID)))
				parked = append(parked, f)
			}
		}
	}
	require.Len(t, parked, park)
	return parked
}

func TestCommandsAgainstEveryStore(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			ok(t, b, b.setup)
			ok(t, b, b.setup) // safe to repeat
			st, err := openStore(ctx, storeOptions{DSN: b.args[1], Table: flagValue(b.args, "-table"),
				Region: flagValue(b.args, "-aws-region"), Endpoint: flagValue(b.args, "-aws-endpoint")})
			require.NoError(t, err)
			t.Cleanup(func() {
				if st.SQL != nil {
					_ = st.SQL.DropTables(context.Background())
				}
				_ = st.Close()
			})
			orders := seed(t, st, "orders", 10, 3)
			invoices := seed(t, st, "invoices", 5, 2)

			// stats
			var stats statsView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "stats", "-json")), &stats))
			require.Equal(t, 10, stats.PendingTotal)
			require.Equal(t, 5, stats.Parked)
			require.Len(t, stats.Pending, 8)
			require.Positive(t, stats.OldestPendingAge)
			require.Contains(t, ok(t, b, "stats"), "pending: 10")

			// list
			var list []messageView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "list", "-status", "parked", "-json")), &list))
			require.Len(t, list, 5)
			for _, m := range list {
				require.Equal(t, "parked", m.Status)
				require.Contains(t, m.LastError, "message too large")
			}
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "list", "-status", "parked", "-topic", "invoices", "-json")), &list))
			require.Len(t, list, 2)
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "list", "-status", "pending", "-json", "-limit", "0")), &list))
			require.Len(t, list, 10)
			bucket := orders[0].Bucket
			want := 0
			for _, m := range list {
				if m.Bucket == bucket {
					want++
				}
			}
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "list", "-status", "pending", "-bucket", fmt.Sprint(bucket), "-json")), &list))
			require.Len(t, list, want)
			for _, m := range list {
				require.Equal(t, bucket, m.Bucket)
			}
			table := ok(t, b, "list")
			require.Contains(t, table, "LAST ERROR")
			require.Contains(t, table, orders[0].ID.String())

			// show
			var shown messageView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "show", orders[0].ID.String(), "-json")), &shown))
			require.Equal(t, orders[0].ID.String(), shown.ID)
			require.Equal(t, "parked", shown.Status)
			require.Equal(t, `{"n":0}`, *shown.Payload)
			require.Equal(t, []headerView{{Key: "trace", Value: "t1"}}, shown.Headers)
			code, _, errOut := ctl(t, b, "show", "0192e0a0-0000-7000-8000-000000000000")
			require.Equal(t, exitNotFound, code, errOut)
			require.Contains(t, errOut, "no message has ID")
			code, _, _ = ctl(t, b, "show", "not-a-uuid")
			require.Equal(t, exitUsage, code)

			// requeue: dry run, by topic, again (nothing left), by id
			require.Contains(t, ok(t, b, "requeue", "-topic", "invoices", "-dry-run"), "dry run: 2 parked messages would be requeued")
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "stats", "-json")), &stats))
			require.Equal(t, 5, stats.Parked, "a dry run changes nothing")
			require.Contains(t, ok(t, b, "requeue", "-topic", "invoices"), "requeued 2 of 2")
			require.Contains(t, ok(t, b, "requeue", "-topic", "invoices"), "requeued 0 of 0", "a re-run finds nothing left")
			require.Contains(t, ok(t, b, "requeue", orders[1].ID.String()), "requeued 1 of 1")
			require.Contains(t, ok(t, b, "requeue", orders[1].ID.String()), "requeued 0 of 1", "requeueing a pending message changes nothing")
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "show", invoices[0].ID.String(), "-json")), &shown))
			require.Equal(t, "pending", shown.Status)
			require.Zero(t, shown.Attempts)

			// purge: by id, then all parked
			require.Contains(t, ok(t, b, "purge", orders[0].ID.String()), "purged 1 of 1")
			code, _, _ = ctl(t, b, "show", orders[0].ID.String())
			require.Equal(t, exitNotFound, code)
			require.Contains(t, ok(t, b, "purge", "-all", "-dry-run"), "dry run: 1 parked messages would be purged")
			require.Contains(t, ok(t, b, "purge", "-all"), "purged 1 of 1")
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "stats", "-json")), &stats))
			require.Equal(t, 0, stats.Parked)
			require.Equal(t, 13, stats.PendingTotal, "10 pending, 2 invoices and 1 order requeued")

			// leases: a relay's heartbeat and claim show up
			now := time.Now()
			inst := driver.Instance{Host: "relay-host", PID: 4242, Nonce: "9f3a5c7e1b2d4f60"}
			_, err = st.Heartbeat(ctx, "relay-a", now, st.BucketCount(), inst)
			require.NoError(t, err)
			claimed, err := st.Claim(ctx, 3, "relay-a", now, now.Add(time.Minute))
			require.NoError(t, err)
			require.True(t, claimed)
			var leases leasesView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "leases", "-json")), &leases))
			require.Len(t, leases.Leases, 8)
			for _, l := range leases.Leases {
				require.Equal(t, l.Bucket != 3, l.Free, "bucket %d", l.Bucket)
			}
			require.Equal(t, "relay-a", leases.Leases[3].Owner)
			require.Len(t, leases.Relays, 1)
			require.Equal(t, 1, leases.Relays[0].Owned)
			require.Equal(t, "relay-host/4242/9f3a5c7e1b2d4f60", leases.Relays[0].Instance, "the process that wrote the heartbeat")
			listing := ok(t, b, "leases")
			require.Contains(t, listing, "relay-a")
			require.Contains(t, listing, "relay-host/4242/9f3a5c7e1b2d4f60", "the listing shows each relay's instance")

			// usage errors
			code, _, errOut = ctl(t, b, "requeue")
			require.Equal(t, exitUsage, code)
			require.Contains(t, errOut, "-all, -topic T, or message IDs")
			code, _, _ = ctl(t, b, "requeue", "-all", "-topic", "x")
			require.Equal(t, exitUsage, code)
			if st.SQL != nil {
				require.Contains(t, ok(t, b, "ddl"), "CREATE TABLE")
				code, _, _ = ctl(t, b, "create-table")
				require.Equal(t, exitUsage, code)
			} else {
				code, _, _ = ctl(t, b, "migrate")
				require.Equal(t, exitUsage, code)
			}
		})
	}
}

func flagValue(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}

func TestUsage(t *testing.T) {
	var out, errOut strings.Builder
	require.Equal(t, exitUsage, run(context.Background(), nil, &out, &errOut))
	require.Equal(t, exitUsage, run(context.Background(), []string{"frobnicate"}, &out, &errOut))
	require.Contains(t, errOut.String(), `unknown command "frobnicate"`)
	errOut.Reset()
	require.Equal(t, exitUsage, run(context.Background(), []string{"stats"}, &out, &errOut))
	require.Contains(t, errOut.String(), "pass -store")
	errOut.Reset()
	require.Equal(t, exitUsage, run(context.Background(), []string{"stats", "-store", "redis://x"}, &out, &errOut))
	require.Contains(t, errOut.String(), "the scheme must be")
	out.Reset()
	require.Equal(t, exitOK, run(context.Background(), []string{"help"}, &out, &errOut))
	for _, c := range commands {
		require.Contains(t, out.String(), "outboxctl "+c.name+" -store DSN", "help shows %s's flags", c.name)
	}
	for _, f := range []string{"-dry-run", "-allow-writes", "-token", "-status", "-json", "Exit codes"} {
		require.Contains(t, out.String(), f)
	}
}
