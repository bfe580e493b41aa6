package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
)

// Bad input exits 2, and the message names the flag the operator typed (never a Go
// field such as Config.Table).
func TestBadInputExitsTwoNamingTheFlag(t *testing.T) {
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	ok(t, backend{args: []string{"-store", dsn}}, "migrate")
	for _, tc := range []struct {
		args  []string
		names string
	}{
		{[]string{"stats", "-store", dsn, "-table", "bad-name"}, `-table "bad-name"`},
		{[]string{"stats", "-store", dsn, "-table", "a.b.c"}, `-table "a.b.c"`},
		{[]string{"stats", "-store", dsn, "-table", strings.Repeat("t", 60)}, "-table"},
		{[]string{"stats", "-store", "postgres://app:hunter2@[::1"}, "-store"},
		{[]string{"stats", "-store", "postgres://app@db:notaport/app"}, "-store"},
		{[]string{"stats", "-store", "mysql://root@localhost/test"}, "-store"},
		{[]string{"stats", "-store", "dynamodb://x", "-aws-region", "us-east-1"}, `-store "dynamodb://x"`},
		{[]string{"stats", "-store", "dynamodb://outbox", "-aws-region", "us-east-1", "-table", "t"}, "-table"},
		{[]string{"stats", "-store", "dynamodb://outbox", "-aws-region", "us-east-1", "-aws-endpoint", "localhost"}, "-aws-endpoint"},
		{[]string{"stats", "-store", dsn, "-buckets", "-3"}, "-buckets -3"},
		{[]string{"stats", "-store", dsn, "extra"}, `"extra"`},
		{[]string{"list", "-store", dsn, "-bucket", "99"}, "-bucket 99: the store has 8 buckets"},
		{[]string{"list", "-store", dsn, "-bucket", "-2"}, "-bucket -2"},
		{[]string{"list", "-store", dsn, "-limit", "-5"}, "-limit -5"},
		{[]string{"list", "-store", dsn, "-status", "gone"}, `-status "gone"`},
		{[]string{"list", "-store", dsn, "-limit", "many"}, "-limit"},
		{[]string{"leases", "-store", dsn, "3"}, `"3"`},
		{[]string{"serve", "-store", dsn, "-page-size", "0"}, "-page-size 0"},
		{[]string{"serve", "-store", dsn, "-refresh", "10ms"}, "-refresh 10ms"},
		{[]string{"serve", "-store", dsn, "-time-zone", "Mars/Olympus"}, `-time-zone "Mars/Olympus"`},
		{[]string{"serve", "-store", dsn, "-host", "http://x/"}, "-host"},
		{[]string{"requeue", "-store", dsn}, "-all, -topic T, or message IDs"},
		{[]string{"show", "-store", dsn, "not-a-uuid"}, `"not-a-uuid" is not a message ID`},
		{[]string{"migrate", "-store", "dynamodb://outbox", "-aws-region", "us-east-1", "-aws-endpoint", "http://127.0.0.1:1"}, "create-table"},
		{[]string{"create-table", "-store", dsn}, "migrate"},
		{[]string{"serve", "-store", dsn, "-listen", "8080"}, `-listen "8080"`},
		{[]string{"migrate", "-store", dsn, "-status", "now"}, `"now"`},
	} {
		var out, errOut strings.Builder
		code := run(context.Background(), tc.args, &out, &errOut)
		require.Equal(t, exitUsage, code, "outboxctl %v: stdout %q stderr %q", tc.args, out.String(), errOut.String())
		require.Contains(t, errOut.String(), tc.names, "outboxctl %v", tc.args)
		require.NotContains(t, errOut.String(), "Config.", "outboxctl %v names a flag, not a field", tc.args)
		require.NotContains(t, errOut.String(), "hunter2", "outboxctl %v prints no password", tc.args)
		require.Empty(t, out.String(), "outboxctl %v prints nothing on stdout", tc.args)
	}

	// A bad value from the environment is bad input too, named by its variable.
	t.Setenv("OUTBOX_LIMIT", "-5")
	var out, errOut strings.Builder
	require.Equal(t, exitUsage, run(context.Background(), []string{"list", "-store", dsn}, &out, &errOut))
	require.Contains(t, errOut.String(), "-limit -5")

	// The rule is in the help.
	out.Reset()
	require.Equal(t, exitOK, run(context.Background(), []string{"help"}, &out, &errOut))
	require.Contains(t, out.String(), "2 bad usage or input")
}

// The bucket count comes from the store; a -buckets that differs is refused.
func TestBucketCountComesFromTheStore(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			// An 8-bucket store (the default) with 10 pending messages.
			ok(t, b, b.setup)
			st, err := openStore(ctx, storeOptions{DSN: b.args[1], Table: flagValue(b.args, "-table"),
				Region: flagValue(b.args, "-aws-region"), Endpoint: flagValue(b.args, "-aws-endpoint")})
			require.NoError(t, err)
			t.Cleanup(func() {
				if st.SQL != nil {
					_ = st.SQL.DropTables(context.Background())
				}
				_ = st.Close()
			})
			seed(t, st, "orders", 10, 0)

			code, out, errOut := ctl(t, b, "stats", "-buckets", "4")
			require.Equal(t, exitUsage, code, "stats -buckets 4 on an 8-bucket store: %s%s", out, errOut)
			require.Contains(t, errOut, "-buckets 4: the store has 8 buckets")
			require.Empty(t, out, "no partial figures")
			code, _, errOut = ctl(t, b, "requeue", "-all", "-buckets", "16")
			require.Equal(t, exitUsage, code, errOut)

			var stats statsView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "stats", "-json")), &stats))
			require.Equal(t, 10, stats.PendingTotal)
			require.Len(t, stats.Pending, 8)
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "stats", "-json", "-buckets", "8")), &stats))
			require.Equal(t, 10, stats.PendingTotal, "the right count is accepted")
		})
	}
}

// A store with another count than the default is read with its own.
func TestSixteenBucketStore(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			ok(t, b, b.setup, "-buckets", "16")
			st, err := openStore(ctx, storeOptions{DSN: b.args[1], Table: flagValue(b.args, "-table"), Buckets: 16,
				Region: flagValue(b.args, "-aws-region"), Endpoint: flagValue(b.args, "-aws-endpoint")})
			require.NoError(t, err)
			t.Cleanup(func() {
				if st.SQL != nil {
					_ = st.SQL.DropTables(context.Background())
				}
				_ = st.Close()
			})
			if st.Dynamo != nil {
				// Nothing is recorded yet: a relay's heartbeat says it.
				_, err := st.Heartbeat(ctx, "relay-16", time.Now(), 16, driver.Instance{})
				require.NoError(t, err)
				require.Contains(t, ok(t, b, "stats"), "buckets: 16 (from relay relay-16's heartbeat")
				code, _, errOut := ctl(t, b, "stats", "-buckets", "8")
				require.Equal(t, exitUsage, code, errOut)
				require.Contains(t, errOut, "relay-16")
			}
			envs := seed(t, st, "orders", 40, 3)
			var high *driver.Envelope
			for _, e := range envs {
				if e.Bucket >= 8 {
					high = e
				}
			}
			require.NotNil(t, high, "some parked message is in buckets 8 to 15")

			var stats statsView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "stats", "-json")), &stats))
			require.Equal(t, 37, stats.PendingTotal, "every pending message, in all 16 buckets")
			require.Equal(t, 3, stats.Parked)
			require.Len(t, stats.Pending, 16)
			code, _, errOut := ctl(t, b, "stats", "-buckets", "8")
			require.Equal(t, exitUsage, code, errOut)
			require.Contains(t, errOut, "the store has 16 buckets")

			var list []messageView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "list", "-status", "parked", "-bucket", fmt.Sprint(high.Bucket), "-json")), &list))
			require.NotEmpty(t, list)
			require.Equal(t, high.Bucket, list[0].Bucket)
			require.Contains(t, ok(t, b, "purge", "-all"), "purged 3 of 3", "purge reaches buckets 8 to 15")
			var leases leasesView
			require.NoError(t, json.Unmarshal([]byte(ok(t, b, "leases", "-json")), &leases))
			require.Len(t, leases.Leases, 16)
			if st.SQL != nil {
				require.Contains(t, ok(t, b, "migrate"), "up to date", "migrate without -buckets keeps the recorded count")
				require.Contains(t, ok(t, b, "ddl"), "16")
			}
		})
	}
}
