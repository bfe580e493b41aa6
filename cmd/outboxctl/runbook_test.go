package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/internal/testenv"
)

// asMain makes the test binary run as outboxctl itself, so that the runbook test
// runs the documented command lines through a shell, pipes and all.
const asMain = "OUTBOXCTL_TEST_RUN_AS_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMain) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// runbookPath is the operations guide whose runbooks the test follows.
const runbookPath = "../../docs/operations.md"

var inlineCommand = regexp.MustCompile("`(outboxctl [^`]+)`")

// runbooks reads the outboxctl commands of each runbook of the operations guide, in
// the order the text gives them: the lines of its code blocks that start with
// outboxctl, and its inline code that does.
func runbooks(t *testing.T) (names []string, commands map[string][]string) {
	t.Helper()
	doc, err := os.ReadFile(runbookPath)
	require.NoError(t, err)
	text := string(doc)
	start := strings.Index(text, "\n## Runbooks\n")
	require.GreaterOrEqual(t, start, 0, "the guide has a Runbooks section")
	text = text[start+len("\n## Runbooks\n"):]
	if end := strings.Index(text, "\n## "); end >= 0 {
		text = text[:end]
	}
	commands = map[string][]string{}
	for _, section := range strings.Split(text, "\n### ")[1:] {
		name, body, _ := strings.Cut(section, "\n")
		names = append(names, name)
		var cmds []string
		var prose strings.Builder
		flush := func() {
			for _, m := range inlineCommand.FindAllStringSubmatch(prose.String(), -1) {
				cmds = append(cmds, strings.Join(strings.Fields(m[1]), " "))
			}
			prose.Reset()
		}
		fenced := false
		for _, line := range strings.Split(body, "\n") {
			trimmed := strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(trimmed, "```"):
				flush()
				fenced = !fenced
			case fenced && strings.HasPrefix(trimmed, "outboxctl "):
				cmds = append(cmds, trimmed)
			case !fenced:
				prose.WriteString(line + "\n")
			}
		}
		flush()
		commands[name] = cmds
	}
	return names, commands
}

// step is one documented command, the placeholders it is run with, and what its
// output must show.
type step struct {
	// doc is the command as the guide writes it, comments and extra spaces aside.
	doc string
	// fill replaces the guide's placeholders (an ID, a topic) with real ones.
	fill  func(cmd string) string
	check func(t *testing.T, out string)
}

// bare drops a command line's comment and extra spaces, to compare it with a step.
func bare(cmd string) string {
	if i := strings.Index(cmd, " #"); i >= 0 {
		cmd = cmd[:i]
	}
	return strings.Join(strings.Fields(cmd), " ")
}

// runbookEnv is a PostgreSQL schema of its own, the shell that runs the documented
// commands there (with outboxctl on PATH and $DSN naming the store), and the store.
type runbookEnv struct {
	dsn, bin string
	st       *openedStore
}

func newRunbookEnv(t *testing.T) *runbookEnv {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	schema := fmt.Sprintf("runbook_%d", time.Now().UnixNano())
	_, err = conn.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		_ = conn.Close(context.Background())
	})
	sep := "?"
	if strings.Contains(testenv.PostgresURL(), "?") {
		sep = "&"
	}
	// The guide's commands use the default table names; the schema keeps them apart.
	return prepareRunbookEnv(t, storeOptions{DSN: testenv.PostgresURL() + sep + "search_path=" + schema})
}

// newLogRunbookEnv is a runbook's environment on a PostgreSQL cluster of its own with
// wal_level=logical, its store in the log mode (tables, publication and slot migrated).
func newLogRunbookEnv(t *testing.T) *runbookEnv {
	t.Helper()
	return prepareRunbookEnv(t, storeOptions{DSN: pgcluster.Start(t, pgcluster.Logical).URL("postgres"), LogMode: true})
}

// prepareRunbookEnv puts outboxctl on the shell's PATH, migrates the store opts names
// through it, and opens the store.
func prepareRunbookEnv(t *testing.T, opts storeOptions) *runbookEnv {
	t.Helper()
	e := &runbookEnv{dsn: opts.DSN, bin: t.TempDir()}
	self, err := os.Executable()
	require.NoError(t, err)
	wrapper := fmt.Sprintf("#!/bin/sh\n%s=1 exec '%s' \"$@\"\n", asMain, self)
	require.NoError(t, os.WriteFile(filepath.Join(e.bin, "outboxctl"), []byte(wrapper), 0o755))
	migrate := "outboxctl migrate -store $DSN"
	if opts.LogMode {
		migrate += " -log-mode"
	}
	require.Contains(t, e.shell(t, migrate), "migrated")
	e.st, err = openStore(context.Background(), opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.st.Close() })
	return e
}

// shell runs a command line as an operator's shell would (bash, failing pipelines
// fail), without any OUTBOX_ variable but $DSN, and returns its output.
func (e *runbookEnv) shell(t *testing.T, line string) string {
	t.Helper()
	cmd := e.command(line)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("%s\nexit %d\nstdout: %s\nstderr: %s", line, exit.ExitCode(), out.String(), errOut.String())
	}
	require.NoError(t, err, line)
	return out.String()
}

// command is the shell that runs line, as shell runs it.
func (e *runbookEnv) command(line string) *exec.Cmd {
	cmd := exec.Command("bash", "-o", "pipefail", "-c", line)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OUTBOX_") && !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "DSN=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "DSN="+e.dsn, "PATH="+e.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	return cmd
}

// follow runs the steps against what the guide writes, in order.
func (e *runbookEnv) follow(t *testing.T, documented []string, steps []step) {
	t.Helper()
	var want []string
	for _, s := range steps {
		want = append(want, s.doc)
	}
	var got []string
	for _, c := range documented {
		got = append(got, bare(c))
	}
	require.Equal(t, want, got, "the runbook's commands as %s writes them", runbookPath)
	for i, s := range steps {
		line := documented[i]
		if s.fill != nil {
			line = s.fill(line)
		}
		out := e.shell(t, line)
		t.Logf("$ %s\n%s", line, out)
		s.check(t, out)
	}
}

// message builds a pending message of topic whose key lands in bucket (any when < 0).
func (e *runbookEnv) message(t *testing.T, topic string, bucket int, n *int) *driver.Envelope {
	t.Helper()
	for {
		*n++
		env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "%s-%d", topic, *n), Payload: fmt.Appendf(nil, `{"n":%d}`, *n)}, e.st.BucketCount())
		require.NoError(t, err)
		if bucket < 0 || env.Bucket == bucket {
			return env
		}
	}
}

func (e *runbookEnv) enqueue(t *testing.T, envs ...*driver.Envelope) {
	t.Helper()
	require.NoError(t, e.st.Enqueue(context.Background(), envs...))
}

// fail does to each message what a relay does when its publish fails: park it, or
// reschedule it with the error.
func (e *runbookEnv) fail(t *testing.T, park bool, cause string, envs ...*driver.Envelope) {
	t.Helper()
	ctx := context.Background()
	for _, want := range envs {
		fetched, err := e.st.Fetch(ctx, want.Bucket, 1000)
		require.NoError(t, err)
		found := false
		for _, f := range fetched.Envelopes {
			if f.ID != want.ID {
				continue
			}
			found = true
			if park {
				require.NoError(t, e.st.Park(ctx, f, cause))
			} else {
				require.NoError(t, e.st.Reschedule(ctx, f, time.Now().Add(time.Hour), cause))
			}
		}
		require.True(t, found, "message %s is due", want.ID)
	}
}

func (e *runbookEnv) status(t *testing.T, id string) (driver.Status, int) {
	t.Helper()
	env, err := e.st.Store.(driver.Finder).Find(context.Background(), mustUUID(t, id))
	if errors.Is(err, driver.ErrNotFound) {
		return 0, -1
	}
	require.NoError(t, err)
	return env.Status, env.Attempts
}

func replace(pairs ...string) func(string) string {
	return strings.NewReplacer(pairs...).Replace
}

func TestRunbooks(t *testing.T) {
	if _, err := exec.LookPath("jq"); err != nil {
		testenv.Unavailable(t, "jq (the parked-messages runbook pipes into it)", err)
	}
	names, documented := runbooks(t)
	tests := map[string]func(t *testing.T, e *runbookEnv, cmds []string){
		"Parked messages":             parkedMessagesRunbook,
		"A missing Kafka topic":       missingTopicRunbook,
		"A stuck bucket":              stuckBucketRunbook,
		"Clock skew":                  clockSkewRunbook,
		"Refused writes":              refusedWritesRunbook,
		"A shared relay ID":           sharedRelayIDRunbook,
		"A slot that stops advancing": slotRunbook,
	}
	// The runbooks of the log mode need a server with wal_level=logical.
	envs := map[string]func(t *testing.T) *runbookEnv{
		"A slot that stops advancing": newLogRunbookEnv,
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			follow, ok := tests[name]
			require.True(t, ok, "the runbook %q of %s has no test here: add one", name, runbookPath)
			env := newRunbookEnv
			if e, ok := envs[name]; ok {
				env = e
			}
			follow(t, env(t), documented[name])
		})
	}
}

func parkedMessagesRunbook(t *testing.T, e *runbookEnv, cmds []string) {
	var n int
	var orders, invoices []*driver.Envelope
	for range 3 {
		orders = append(orders, e.message(t, "orders", -1, &n))
	}
	for range 2 {
		invoices = append(invoices, e.message(t, "invoices", -1, &n))
	}
	pending := e.message(t, "orders", -1, &n)
	e.enqueue(t, append(append([]*driver.Envelope{pending}, orders...), invoices...)...)
	const tooLarge = "kafkatransport: MESSAGE_TOO_LARGE: the request included a message larger than the max message size the server will accept"
	const denied = "kafkatransport: TOPIC_AUTHORIZATION_FAILED: not authorized to access topics: [invoices]"
	e.fail(t, true, tooLarge, orders...)
	e.fail(t, true, denied, invoices...)

	e.follow(t, cmds, []step{
		{doc: "outboxctl stats -store $DSN", check: func(t *testing.T, out string) {
			require.Contains(t, out, "pending: 1")
			require.Contains(t, out, "parked:  5")
		}},
		{doc: "outboxctl list -store $DSN -status parked", check: func(t *testing.T, out string) {
			for _, e := range append(orders, invoices...) {
				require.Contains(t, out, e.ID.String())
			}
			require.NotContains(t, out, pending.ID.String())
			require.Contains(t, out, "TOPIC_AUTHORIZATION_FAILED")
		}},
		{doc: "outboxctl show -store $DSN 0192f0c4-…", fill: replace("0192f0c4-…", orders[0].ID.String()), check: func(t *testing.T, out string) {
			require.Contains(t, out, orders[0].ID.String())
			require.Contains(t, out, "MESSAGE_TOO_LARGE")
			require.Contains(t, out, "parked")
		}},
		{doc: "outboxctl list -store $DSN -status parked -json -limit 0 | jq -r '.[].last_error' | sort | uniq -c", check: func(t *testing.T, out string) {
			require.Regexp(t, `(?m)^\s*3 `+regexp.QuoteMeta(tooLarge)+`$`, out)
			require.Regexp(t, `(?m)^\s*2 `+regexp.QuoteMeta(denied)+`$`, out)
		}},
		{doc: "outboxctl requeue -store $DSN -topic orders -dry-run", check: func(t *testing.T, out string) {
			require.Contains(t, out, "dry run: 3 parked messages would be requeued")
			s, _ := e.status(t, orders[0].ID.String())
			require.Equal(t, driver.Parked, s, "a dry run changes nothing")
		}},
		{doc: "outboxctl requeue -store $DSN -topic orders", check: func(t *testing.T, out string) {
			require.Contains(t, out, "requeued 3 of 3")
			for _, o := range orders {
				s, attempts := e.status(t, o.ID.String())
				require.Equal(t, driver.Pending, s)
				require.Zero(t, attempts, "attempts reset")
			}
		}},
		{doc: "outboxctl purge -store $DSN ID…", fill: replace("ID…", invoices[0].ID.String()+" "+invoices[1].ID.String()), check: func(t *testing.T, out string) {
			require.Contains(t, out, "purged 2 of 2")
			for _, i := range invoices {
				_, attempts := e.status(t, i.ID.String())
				require.Equal(t, -1, attempts, "message %s is gone", i.ID)
			}
		}},
	})
}

func missingTopicRunbook(t *testing.T, e *runbookEnv, cmds []string) {
	const topic, misspelt = "orders.eu", "ordrs"
	var n int
	failing := []*driver.Envelope{e.message(t, topic, -1, &n), e.message(t, topic, -1, &n)}
	wrong := []*driver.Envelope{e.message(t, misspelt, -1, &n)}
	e.enqueue(t, append(failing, wrong...)...)
	cause := func(topic string) string {
		return fmt.Sprintf("kafkatransport: topic %q does not exist: UNKNOWN_TOPIC_OR_PARTITION: This server does not host this topic-partition.", topic)
	}
	e.fail(t, false, cause(topic), failing...)
	e.fail(t, true, cause(misspelt), wrong...)

	e.follow(t, cmds, []step{
		{doc: "outboxctl list -store $DSN -status pending -topic T", fill: replace("-topic T", "-topic "+topic), check: func(t *testing.T, out string) {
			for _, f := range failing {
				require.Regexp(t, regexp.QuoteMeta(f.ID.String())+`\s+`+regexp.QuoteMeta(topic)+`\s+\d+\s+\d+\s+pending\s+1\s`, out, "attempts 1")
			}
			require.Contains(t, out, "UNKNOWN_TOPIC_OR_PARTITION")
			// The relay parks them after -max-attempts.
			e.fail(t, true, cause(topic), failing...)
		}},
		{doc: "outboxctl requeue -store $DSN -topic T -dry-run", fill: replace("-topic T", "-topic "+topic), check: func(t *testing.T, out string) {
			require.Contains(t, out, "dry run: 2 parked messages would be requeued")
			// "then without -dry-run":
			out = e.shell(t, strings.Replace(replace("-topic T", "-topic "+topic)(cmds[1]), " -dry-run", "", 1))
			require.Contains(t, out, "requeued 2 of 2")
			for _, f := range failing {
				s, _ := e.status(t, f.ID.String())
				require.Equal(t, driver.Pending, s)
			}
		}},
		{doc: "outboxctl purge -store $DSN -topic T", fill: replace("-topic T", "-topic "+misspelt), check: func(t *testing.T, out string) {
			require.Contains(t, out, "purged 1 of 1")
			_, attempts := e.status(t, wrong[0].ID.String())
			require.Equal(t, -1, attempts, "the misspelt topic's message is gone")
			s, _ := e.status(t, failing[0].ID.String())
			require.Equal(t, driver.Pending, s, "the other topic's are untouched")
		}},
	})
}

var leaseRow = regexp.MustCompile(`(?m)^(\d+)\s+(\S+)\s+(.*)$`)

// leaseRows reads the lease table of "outboxctl leases": bucket → owner, expiry.
func leaseRows(out string) map[string][2]string {
	rows := map[string][2]string{}
	table, _, _ := strings.Cut(out, "\nRELAY")
	for _, m := range leaseRow.FindAllStringSubmatch(table, -1) {
		rows[m[1]] = [2]string{m[2], strings.TrimSpace(m[3])}
	}
	return rows
}

func stuckBucketRunbook(t *testing.T, e *runbookEnv, cmds []string) {
	ctx := context.Background()
	var n int
	var stuck []*driver.Envelope
	for range 20 {
		stuck = append(stuck, e.message(t, "orders", 3, &n))
	}
	e.enqueue(t, stuck...)
	for b := range e.st.BucketCount() {
		if b != 3 {
			e.enqueue(t, e.message(t, "orders", b, &n))
		}
	}
	head := stuck[0]
	e.fail(t, false, "kafkatransport: produce: context deadline exceeded", head)
	now := time.Now()
	_, err := e.st.Heartbeat(ctx, "relay-a", now, e.st.BucketCount(), driver.Instance{})
	require.NoError(t, err)
	for b := range e.st.BucketCount() {
		if b != 3 {
			claimed, err := e.st.Claim(ctx, b, "relay-a", now, now.Add(30*time.Second))
			require.NoError(t, err)
			require.True(t, claimed)
		}
	}

	e.follow(t, cmds, []step{
		{doc: "outboxctl stats -store $DSN", check: func(t *testing.T, out string) {
			require.Regexp(t, `(?m)^3\s+20$`, out, "bucket 3 far above the others")
			require.Regexp(t, `(?m)^2\s+1$`, out)
		}},
		{doc: "outboxctl leases -store $DSN", check: func(t *testing.T, out string) {
			rows := leaseRows(out)
			require.Equal(t, "(free)", rows["3"][0], "bucket 3 has nobody publishing it")
			require.Equal(t, "relay-a", rows["2"][0])
		}},
		{doc: "outboxctl list -store $DSN -status pending -bucket 3 -limit 5", check: func(t *testing.T, out string) {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			require.Len(t, lines, 6, "a header and 5 messages")
			require.Contains(t, lines[1], head.ID.String(), "the head first")
			require.Regexp(t, `pending\s+1\s`, lines[1], "with attempts")
			require.Contains(t, lines[1], "context deadline exceeded", "and its last error")
		}},
		{doc: "outboxctl purge -store $DSN ID", fill: replace("$DSN ID", "$DSN "+head.ID.String()), check: func(t *testing.T, out string) {
			require.Contains(t, out, "purged 1 of 1")
			_, attempts := e.status(t, head.ID.String())
			require.Equal(t, -1, attempts, "the head is gone")
		}},
	})
}

func clockSkewRunbook(t *testing.T, e *runbookEnv, cmds []string) {
	ctx := context.Background()
	// A relay whose clock runs two hours ahead wrote its heartbeat and lease.
	ahead := time.Now().Add(2 * time.Hour)
	_, err := e.st.Heartbeat(ctx, "relay-ahead", ahead, e.st.BucketCount(), driver.Instance{})
	require.NoError(t, err)
	claimed, err := e.st.Claim(ctx, 5, "relay-ahead", ahead, ahead.Add(30*time.Second))
	require.NoError(t, err)
	require.True(t, claimed)

	e.follow(t, cmds, []step{
		{doc: "outboxctl leases -store $DSN", check: func(t *testing.T, out string) {
			row := leaseRows(out)["5"]
			require.Equal(t, "relay-ahead", row[0])
			m := regexp.MustCompile(`\(in (\S+)\)`).FindStringSubmatch(row[1])
			require.NotNil(t, m, "an expiry: %q", row[1])
			in, err := time.ParseDuration(m[1])
			require.NoError(t, err)
			require.Greater(t, in, time.Hour, "an expiry far beyond the lease duration shows")
			require.Regexp(t, `relay-ahead\s+\S+ \(-`, out, "a heartbeat in the future shows as a negative age")
		}},
	})
}

func refusedWritesRunbook(t *testing.T, e *runbookEnv, cmds []string) {
	ctx := context.Background()
	now := time.Now()
	_, err := e.st.Heartbeat(ctx, "relay-shared", now, e.st.BucketCount(), driver.Instance{})
	require.NoError(t, err)
	for _, b := range []int{0, 1} {
		claimed, err := e.st.Claim(ctx, b, "relay-shared", now, now.Add(30*time.Second))
		require.NoError(t, err)
		require.True(t, claimed)
	}
	e.follow(t, cmds, []step{
		{doc: "outboxctl leases -store $DSN", check: func(t *testing.T, out string) {
			require.Regexp(t, `(?m)^relay-shared\s.*active\s+2\s`, out, "one relay ID, holding two buckets")
		}},
	})
}

func sharedRelayIDRunbook(t *testing.T, e *runbookEnv, cmds []string) {
	ctx := context.Background()
	inst := driver.Instance{Host: "host-b", PID: 4242, Nonce: "n0nce"}
	_, err := e.st.Heartbeat(ctx, "relay-shared", time.Now(), e.st.BucketCount(), inst)
	require.NoError(t, err)
	e.follow(t, cmds, []step{
		{doc: "outboxctl leases -store $DSN", check: func(t *testing.T, out string) {
			require.Regexp(t, `(?m)^relay-shared\s.*host-b/4242/n0nce`, out, "the instance that wrote the last heartbeat")
		}},
	})
}

func slotRunbook(t *testing.T, e *runbookEnv, cmds []string) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, e.dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	slotExists := func() bool {
		var n int
		require.NoError(t, conn.QueryRow(ctx, "SELECT COUNT(*) FROM pg_replication_slots WHERE slot_name = 'outbox_messages_slot'").Scan(&n))
		return n == 1
	}
	// Writers put messages into the log; the relay that holds the stream lease does
	// not read it (it cannot open the slot), and the broker refused two messages,
	// which went to the table.
	var msgs []outbox.Message
	for i := range 40 {
		msgs = append(msgs, outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", i), Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
	}
	require.NoError(t, e.st.SQL.Enqueue(ctx, msgs...))
	now := time.Now()
	claimed, err := e.st.Claim(ctx, driver.StreamLease, "relay-a", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, claimed)
	require.True(t, slotExists())
	var n int
	diverted := []*driver.Envelope{e.message(t, "orders", -1, &n), e.message(t, "orders", -1, &n)}
	e.enqueue(t, diverted...)

	e.follow(t, cmds, []step{
		{doc: "outboxctl stats -store $DSN -log-mode", check: func(t *testing.T, out string) {
			m := regexp.MustCompile(`(?m)^stream:\s+(\d+) bytes behind, reader active: false,`).FindStringSubmatch(out)
			require.NotNil(t, m, "the slot's lag and its reader")
			require.NotEqual(t, "0", m[1], "the slot keeps the unread messages")
		}},
		{doc: "outboxctl leases -store $DSN -log-mode", check: func(t *testing.T, out string) {
			require.Regexp(t, `(?m)^stream\s+relay-a\s+\S+ \(in `, out, "the relay holding the stream lease")
		}},
		{doc: "outboxctl list -store $DSN -log-mode -status pending", check: func(t *testing.T, out string) {
			for _, d := range diverted {
				require.Contains(t, out, d.ID.String())
			}
			require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 3, "a header and the two messages in the table")
		}},
		{doc: "outboxctl drop-log -store $DSN -log-mode -yes", check: func(t *testing.T, out string) {
			require.Contains(t, out, "dropped the replication slot outbox_messages_slot")
			require.False(t, slotExists(), "the slot is gone")
			// Without -yes it refuses, exit 2.
			out2, err := e.command(strings.Replace(cmds[3], " -yes", "", 1)).CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "%s", out2)
			require.Equal(t, exitUsage, exit.ExitCode())
			require.Contains(t, string(out2), "-yes")
		}},
		{doc: "outboxctl migrate -store $DSN -log-mode", check: func(t *testing.T, out string) {
			require.Contains(t, out, "the replication slot outbox_messages_slot exist")
			require.True(t, slotExists(), "the slot is back")
		}},
	})
}
