package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxkit/outbox/internal/pgcluster"
)

// unavailable fails the test under CI=true, where every service must be there, and
// skips it otherwise.
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is required under CI=true: %v", what, err)
	}
	t.Skipf("%s is not available (%v); install or start it (or point OUTBOX_TEST_MYSQL_DSN at a MariaDB) to run this test", what, err)
}

type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestQuickRunDeliversEveryMessageExactly runs every scenario of every contender at
// a tiny size against the real databases and an in-process Kafka, and checks what
// the consumer got: nothing here depends on how fast the machine is.
func TestQuickRunDeliversEveryMessageExactly(t *testing.T) {
	ctx := context.Background()
	db, err := openMySQL(ctx, 1)
	if err != nil {
		unavailable(t, "MariaDB", err)
	}
	db.Close()
	progress = logWriter{t}
	t.Cleanup(func() { progress = os.Stderr })

	opts, err := parseFlags([]string{"-quick", "-large"})
	if err != nil {
		t.Fatal(err)
	}
	opts.resize = func(sz *sizes) {
		sz.writeTx, sz.writeTxEach = 20, 5
		sz.backlog, sz.largeBacklog = 200, 400
		sz.latencyFor = 500 * time.Millisecond
		sz.soakFor, sz.soakWindow = 2*time.Second, time.Second
	}
	// The PostgreSQL scenarios run on a cluster runAll starts with wal_level=logical.
	rep, err := runAll(ctx, opts, true)
	if errors.Is(err, pgcluster.ErrNoPostgres) {
		unavailable(t, "PostgreSQL's programs (initdb, pg_ctl)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.checkErrors(); err != nil {
		t.Fatal(err)
	}
	all := map[string]*checks{}
	for _, w := range []*writeResult{rep.Write, rep.WriteMy} {
		for name, c := range w.Checks {
			all["write "+w.DB+" "+name] = c
		}
	}
	for name, c := range rep.Drain.Checks {
		all["drain "+name] = c
	}
	for name, c := range rep.Latency.Checks {
		all["latency "+name] = c
	}
	all["soak "+rep.Soak.Contender] = &rep.Soak.Checks
	all["soak "+rep.SoakLog.Contender] = &rep.SoakLog.Checks
	if len(all) != 5+2+4+4+2 {
		t.Errorf("checked %d contender scenarios, want 17", len(all))
	}
	for what, c := range all {
		if c.Runs == 0 || c.Sent == 0 || c.Missing != 0 || c.Corrupt != 0 || c.Received < c.Sent {
			t.Errorf("%s: %+v", what, *c)
		}
	}

	// The report goes between the markers and leaves the page around them alone.
	dir := t.TempDir()
	page := filepath.Join(dir, "benchmarks.md")
	if err := os.WriteFile(page, []byte("intro\n"+beginMarker+"\nold\n"+endMarker+"\noutro\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts.out, opts.images = page, filepath.Join(dir, "images")
	stdout := os.Stdout
	os.Stdout, _ = os.Open(os.DevNull)
	err = publish(rep, opts)
	os.Stdout.Close()
	os.Stdout = stdout
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	text := string(got)
	if !strings.HasPrefix(text, "intro\n"+beginMarker) || !strings.HasSuffix(text, endMarker+"\noutro\n") || strings.Contains(text, "old") {
		t.Errorf("the page was not spliced between its markers:\n%s", text)
	}
	for _, want := range []string{"**Quick run**", "### Write cost, PostgreSQL", "### Write cost, MariaDB", "### Drain", "### Commit → consumer latency",
		"### Soak, outbox on PostgreSQL", "### Soak, outbox (log) on PostgreSQL", "| outbox (log) |", "written while stopped", "### Delivery checks", "![write cost on PostgreSQL](images/bench-write.svg)"} {
		if !strings.Contains(text, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	for _, name := range []string{"bench-write.svg", "bench-write-mariadb.svg", "bench-drain.svg", "bench-latency.svg", "bench-soak-p99.svg", "bench-soak-size.svg",
		"bench-soak-log-p99.svg", "bench-soak-log-size.svg"} {
		if b, err := os.ReadFile(filepath.Join(dir, "images", name)); err != nil || !strings.Contains(string(b), "<svg") {
			t.Errorf("chart %s: %v", name, err)
		}
	}
}

// Every key belongs to one writer, so a key's ids are committed in increasing order.
func TestPlanGivesEachKeyOneWriter(t *testing.T) {
	for _, writers := range []int{1, 4, 8} {
		p := newPlan(writers)
		owner := map[string]int{}
		for w := range writers {
			for _, m := range p.next(w, 300) {
				if o, ok := owner[string(m.key)]; ok && o != w {
					t.Fatalf("%d writers: key %s written by %d and %d", writers, m.key, o, w)
				}
				owner[string(m.key)] = w
				if id, ok := payloadID(m.payload); !ok || id != m.id || !p.sent(id) {
					t.Fatalf("payload of %d carries %d", m.id, id)
				}
			}
		}
		if len(owner) != keyCount {
			t.Errorf("%d writers use %d keys, want %d", writers, len(owner), keyCount)
		}
	}
}
