package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/pgcluster"
)

// logCluster is a PostgreSQL cluster of the test's own with wal_level=logical, the
// backend that reaches it in the log mode, and a pool on it.
type logCluster struct {
	dsn  string
	b    backend
	pool *pgxpool.Pool
}

func newLogCluster(t *testing.T) *logCluster {
	t.Helper()
	c := pgcluster.Start(t, pgcluster.Logical)
	dsn := c.URL("postgres")
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &logCluster{dsn: dsn, b: backend{name: "postgres-log", args: []string{"-store", dsn, "-log-mode"}}, pool: pool}
}

// exists reports whether the query (a SELECT of one name) finds name.
func (lc *logCluster) exists(t *testing.T, query, name string) bool {
	t.Helper()
	var n int
	require.NoError(t, lc.pool.QueryRow(context.Background(), "SELECT COUNT(*) FROM ("+query+") AS q(name) WHERE name = $1", name).Scan(&n))
	return n == 1
}

func (lc *logCluster) slot(t *testing.T, name string) bool {
	return lc.exists(t, "SELECT slot_name::text FROM pg_replication_slots", name)
}

func (lc *logCluster) publication(t *testing.T, name string) bool {
	return lc.exists(t, "SELECT pubname::text FROM pg_publication", name)
}

// store opens the cluster's store in the log mode, as the writers and relays do.
func (lc *logCluster) store(t *testing.T) *openedStore {
	t.Helper()
	st, err := openStore(context.Background(), storeOptions{DSN: lc.dsn, LogMode: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// writeLog puts n messages into the log, as the writers of the log mode do.
func writeLog(t *testing.T, st *openedStore, n int) {
	t.Helper()
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", i), Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
	}
	require.NoError(t, st.SQL.Enqueue(context.Background(), msgs...))
}

func TestLogModeCommands(t *testing.T) {
	lc := newLogCluster(t)
	b := lc.b
	ctx := context.Background()

	// migrate -log-mode creates the tables, the publication and the slot; again, it
	// changes nothing.
	out := ok(t, b, "migrate")
	require.Contains(t, out, "log mode: the publication outbox_messages_pub and the replication slot outbox_messages_slot exist")
	require.True(t, lc.slot(t, "outbox_messages_slot"))
	require.True(t, lc.publication(t, "outbox_messages_pub"))
	ok(t, b, "migrate")
	out = ok(t, b, "migrate", "-slot", "orders_slot", "-publication", "orders_pub")
	require.Contains(t, out, "the publication orders_pub and the replication slot orders_slot exist")
	require.True(t, lc.slot(t, "orders_slot"), "-slot names the slot migrate creates")
	require.True(t, lc.publication(t, "orders_pub"))

	// Messages in the log that no relay reads: stats shows the slot's lag, no reader.
	st := lc.store(t)
	writeLog(t, st, 50)
	out = ok(t, b, "stats")
	m := regexp.MustCompile(`(?m)^stream:\s+(\d+) bytes behind, reader active: false, lag \S+$`).FindStringSubmatch(out)
	require.NotNil(t, m, "stats prints the slot's lag: %s", out)
	require.NotEqual(t, "0", m[1], "50 messages not read keep the slot behind")
	require.Contains(t, out, "pending: 0", "the log mode writes no row")
	var sv statsView
	require.NoError(t, json.Unmarshal([]byte(ok(t, b, "stats", "-json")), &sv))
	require.NotNil(t, sv.Stream)
	require.Positive(t, sv.Stream.LagBytes)
	require.False(t, sv.Stream.Active)

	// leases shows the stream lease: free, then a relay's, then free again.
	streamRow := regexp.MustCompile(`(?m)^stream\s+(\S+)\s+(.*)$`)
	m = streamRow.FindStringSubmatch(ok(t, b, "leases"))
	require.NotNil(t, m, "leases shows the stream lease's row")
	require.Equal(t, "(free)", m[1], "no relay ever took the stream")
	now := time.Now().Truncate(time.Microsecond)
	claimed, err := st.Claim(ctx, driver.StreamLease, "relay-a", now, now.Add(30*time.Second))
	require.NoError(t, err)
	require.True(t, claimed)
	out = ok(t, b, "leases")
	m = streamRow.FindStringSubmatch(out)
	require.NotNil(t, m, out)
	require.Equal(t, "relay-a", m[1])
	require.Regexp(t, `\(in (29|30)s\)$`, m[2])
	require.Regexp(t, `(?m)^0\s+\(free\)`, out, "the bucket leases are rows of their own")
	var lv leasesView
	require.NoError(t, json.Unmarshal([]byte(ok(t, b, "leases", "-json")), &lv))
	require.NotNil(t, lv.Stream)
	require.Equal(t, leaseView{Bucket: driver.StreamLease, Owner: "relay-a", ExpiresAt: now.Add(30 * time.Second).UTC(), Free: false}, *lv.Stream)
	require.Len(t, lv.Leases, st.BucketCount(), "the stream lease is not a bucket's")
	require.NotContains(t, ok(t, backend{args: []string{"-store", lc.dsn}}, "leases"), "stream", "a store opened in the table mode has no stream")

	// drop-log refuses to run without -yes, changing nothing.
	code, _, errOut := ctl(t, b, "drop-log")
	require.Equal(t, exitUsage, code, errOut)
	require.Contains(t, errOut, "pass -yes to confirm")
	require.True(t, lc.slot(t, "outbox_messages_slot"), "nothing dropped without -yes")

	// A slot a reader has open is not dropped: the error says which process has it.
	stream, err := st.Store.(driver.Streamer).OpenStream(ctx)
	require.NoError(t, err)
	code, _, errOut = ctl(t, b, "drop-log", "-yes")
	require.Equal(t, exitFailed, code, errOut)
	require.Contains(t, errOut, "is active for PID")
	require.NoError(t, stream.Close(ctx))

	// With -yes: the slot and the publication are gone; again, nothing to drop.
	eventually(t, func() bool {
		code, _, _ := ctl(t, b, "drop-log", "-yes")
		return code == exitOK
	}, "drop-log once the reader let go of the slot")
	require.False(t, lc.slot(t, "outbox_messages_slot"))
	require.False(t, lc.publication(t, "outbox_messages_pub"))
	require.True(t, lc.slot(t, "orders_slot"), "another store's slot stays")
	require.Contains(t, ok(t, b, "drop-log", "-yes"), "dropped the replication slot outbox_messages_slot and the publication outbox_messages_pub (if they existed)")
	// Another store's names, with or without -log-mode.
	ok(t, backend{args: []string{"-store", lc.dsn}}, "drop-log", "-yes", "-slot", "orders_slot", "-publication", "orders_pub")
	require.False(t, lc.slot(t, "orders_slot"))
	require.False(t, lc.publication(t, "orders_pub"))

	// migrate -log-mode creates them again.
	ok(t, b, "migrate")
	require.True(t, lc.slot(t, "outbox_messages_slot"))
}

// eventually polls cond until it holds, for a minute at most.
func eventually(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		require.True(t, time.Now().Before(deadline), "%s never happened", what)
		time.Sleep(100 * time.Millisecond)
	}
}

// The log mode's flags are refused, naming the flag, where they cannot apply, before
// anything is read or changed.
func TestLogModeFlagsRefused(t *testing.T) {
	sqlite := backend{name: "sqlite", args: []string{"-store", "sqlite:" + t.TempDir() + "/outbox.db"}}
	pg := backend{name: "postgres", args: []string{"-store", "postgres://127.0.0.1:1/none"}}
	for _, tc := range []struct {
		b    backend
		args []string
		want string
	}{
		{sqlite, []string{"stats", "-log-mode"}, "-log-mode is for PostgreSQL stores"},
		{sqlite, []string{"migrate", "-slot", "s"}, "-slot is for PostgreSQL stores"},
		{sqlite, []string{"drop-log", "-yes"}, "drop-log is for PostgreSQL stores"},
		{sqlite, []string{"drop-log"}, "pass -yes to confirm"},
		{pg, []string{"stats", "-slot", "s"}, "-slot is a setting of the log mode: add -log-mode"},
		{pg, []string{"leases", "-replication-url", "postgres://127.0.0.1:1/none"}, "-replication-url is a setting of the log mode"},
		{pg, []string{"stats", "-log-mode", "-publication", "no-dashes"}, `-publication "no-dashes"`},
		{pg, []string{"drop-log", "-yes", "extra"}, "drop-log takes no arguments"},
	} {
		code, out, errOut := ctl(t, tc.b, tc.args...)
		require.Equal(t, exitUsage, code, "%v: %s%s", tc.args, out, errOut)
		require.Contains(t, errOut, tc.want, "%v", tc.args)
	}
	var out strings.Builder
	require.Equal(t, exitOK, run(context.Background(), []string{"drop-log", "-help"}, &out, &out))
	for _, f := range []string{"-yes", "-log-mode", "-slot", "-publication", "-replication-url", "outbox_messages_slot"} {
		require.Contains(t, out.String(), f)
	}
}

// The admin page of a store in the log mode shows the slot's lag (bytes, age, whether
// a reader has it) and the stream lease; as a reader confirms what it read, the lag
// shrinks and the reader shows active.
func TestAdminPageShowsTheSlot(t *testing.T) {
	ctx := browser(t)
	lc := newLogCluster(t)
	st := lc.store(t)
	bg := context.Background()
	require.NoError(t, st.SQL.Migrate(bg))
	writeLog(t, st, 50)
	now := time.Now().Truncate(time.Microsecond)
	claimed, err := st.Claim(bg, driver.StreamLease, "relay-a", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, claimed)
	srv := serveStore(t, st, adminOptions{})
	lag := func() *driver.StreamLag {
		s, err := st.Store.(driver.Admin).Stats(bg)
		require.NoError(t, err)
		require.NotNil(t, s.Stream, "a store in the log mode samples its slot")
		return s.Stream
	}

	// No reader: the slot keeps the 50 messages' WAL.
	before := lag()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#stream-cards"))))
	after := lag()
	shown := eval[int64](t, ctx, `Number(document.querySelector("#stream-lag-bytes").dataset.bytes)`)
	require.GreaterOrEqual(t, shown, before.Bytes, "the page reads the slot's lag")
	require.LessOrEqual(t, shown, after.Bytes)
	require.Equal(t, size(shown), pageText(t, ctx, "#stream-lag-bytes"))
	require.Equal(t, "none", pageText(t, ctx, "#stream-active"))
	require.True(t, eval[bool](t, ctx, `document.querySelector("#stream-active").parentElement.classList.contains("warn")`), "no reader is a warning")
	age, err := time.ParseDuration(pageText(t, ctx, "#stream-lag-age"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, age, time.Duration(0))
	require.Equal(t, []string{"stream", "relay-a"}, eval[[]string](t, ctx, `[...document.querySelectorAll("#stream-lease td")].slice(0, 2).map(td => td.textContent.trim())`))
	require.Len(t, eval[[]string](t, ctx, `[...document.querySelectorAll("#leases tr.lease")].map(tr => tr.dataset.bucket)`), st.BucketCount(), "the bucket leases as before")

	// A reader reads and confirms the 50: the page shows it active, the lag down.
	stream, err := st.Store.(driver.Streamer).OpenStream(bg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = stream.Close(bg) })
	read := 0
	var pos driver.StreamPosition
	for read < 50 {
		envs, p, err := stream.Next(bg)
		require.NoError(t, err)
		if len(envs) > 0 {
			read, pos = read+len(envs), p
		}
	}
	require.NoError(t, stream.Confirm(bg, pos))
	var last int64
	for deadline := time.Now().Add(time.Minute); ; {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#stream-cards"))))
		last = eval[int64](t, ctx, `Number(document.querySelector("#stream-lag-bytes").dataset.bytes)`)
		if last < shown && pageText(t, ctx, "#stream-active") == "active" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the page never showed the confirmed slot with its reader: %d bytes (was %d), reader %q", last, shown, pageText(t, ctx, "#stream-active"))
		time.Sleep(200 * time.Millisecond)
	}
	require.False(t, eval[bool](t, ctx, `document.querySelector("#stream-active").parentElement.classList.contains("warn")`))
}
