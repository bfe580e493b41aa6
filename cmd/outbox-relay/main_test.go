package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// childEnv makes the test binary run the relay's main instead of the tests, so the
// relay runs as a real child process.
const childEnv = "OUTBOX_RELAY_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// relayProcess is a running relay.
type relayProcess struct {
	cmd      *exec.Cmd
	addr     chan string // the endpoints' address, from the logs
	mu       sync.Mutex
	lines    []map[string]any
	badLines []string
	done     chan struct{}
	exitErr  error
}

func startRelay(t *testing.T, args ...string) *relayProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &relayProcess{cmd: cmd, addr: make(chan string, 1), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var rec map[string]any
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				p.mu.Lock()
				p.badLines = append(p.badLines, sc.Text())
				p.mu.Unlock()
				continue
			}
			p.mu.Lock()
			p.lines = append(p.lines, rec)
			p.mu.Unlock()
			if rec["msg"] == "outbox-relay: endpoints listening" {
				p.addr <- rec["address"].(string)
			}
		}
		p.exitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			p.mu.Lock()
			for _, l := range p.lines {
				t.Logf("relay log: %v", l)
			}
			p.mu.Unlock()
		}
	})
	return p
}

func (p *relayProcess) logged(msg string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if l["msg"] == msg {
			return true
		}
	}
	return false
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// metric sums the samples of a Prometheus metric whose labels contain every want
// label and none of the absent ones.
func metric(body, name string, want []string, absent ...string) (float64, bool) {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? ([0-9.eE+-]+)$`)
	total, found := 0.0, false
	for _, line := range strings.Split(body, "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(m[1], w)
		}
		for _, a := range absent {
			ok = ok && !strings.Contains(m[1], a)
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err == nil {
			total, found = total+v, true
		}
	}
	return total, found
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRelayDrainsServesAndHandsBack(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "orders"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)

	table := fmt.Sprintf("relay_test_%08x", rand.Uint32())
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	t.Cleanup(func() {
		_ = store.DropTables(context.Background())
		_ = store.Close()
	})
	ds := store.Driver()
	const n = 200
	ids := map[string]bool{}
	var envs []*driver.Envelope
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", i%37), Payload: fmt.Appendf(nil, "payload %d", i)}, ds.BucketCount())
		require.NoError(t, err)
		envs = append(envs, env)
		ids[env.ID.String()] = true
	}
	require.NoError(t, ds.Enqueue(ctx, envs...))

	relayID := "relay-under-test"
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	p := startRelay(t,
		"-store", testenv.PostgresURL(), "-table", table,
		"-kafka-brokers", strings.Join(cluster.ListenAddrs(), ","),
		"-listen", "127.0.0.1:0", "-relay-id", relayID,
		"-poll-interval", "50ms", "-lease-duration", "6s", "-lease-renew-interval", "1s", "-kafka-ack-timeout", "3s",
		"-backlog-interval", "1ms", "-log-level", "debug")
	var addr string
	select {
	case addr = <-p.addr:
	case <-p.done:
		t.Fatalf("the relay exited: %v", p.exitErr)
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not report its endpoints")
	}
	base := "http://" + addr

	code, body := get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code, body)

	eventually(t, 60*time.Second, "ready", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK
	})
	_, body = get(t, base+"/readyz")
	var ready struct {
		Status string `json:"status"`
		Relay  string `json:"relay"`
		Owned  []int  `json:"owned"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	require.Equal(t, "ready", ready.Status)
	require.Equal(t, relayID, ready.Relay)
	require.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7}, ready.Owned, "a lone relay holds every bucket")

	// Every message reaches Kafka, and the store forgets it.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	t.Cleanup(consumer.Close)
	seen := map[string]bool{}
	consumeCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for len(seen) < n {
		fetches := consumer.PollFetches(consumeCtx)
		require.NoError(t, consumeCtx.Err(), "consumed %d of %d", len(seen), n)
		fetches.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderMessageID && ids[string(h.Value)] {
					seen[string(h.Value)] = true
				}
			}
		})
	}
	eventually(t, 30*time.Second, "an empty outbox", func() bool {
		st, err := ds.(driver.Admin).Stats(ctx)
		require.NoError(t, err)
		for _, c := range st.Pending {
			if c != 0 {
				return false
			}
		}
		return true
	})

	// The metrics say the same.
	eventually(t, 60*time.Second, "metrics of the drain and an empty backlog sample", func() bool {
		_, body = get(t, base+"/metrics")

		sent, _ := metric(body, "messaging_client_sent_messages_total", []string{`messaging_destination_name="orders"`, `messaging_system="kafka"`}, "error_type")
		pending, okP := metric(body, "outbox_backlog_pending", nil)
		owned, okO := metric(body, "outbox_relay_owned_buckets", []string{`outbox_relay_id="` + relayID + `"`})
		return sent == n && okP && pending == 0 && okO && owned == 8
	})
	completed, _ := metric(body, "outbox_messages_completed_total", nil)
	require.Equal(t, float64(n), completed)
	lagCount, ok := metric(body, "outbox_message_lag_seconds_count", nil)
	require.True(t, ok, "lag histogram exported")
	require.Equal(t, float64(n), lagCount)
	refused, _ := metric(body, "outbox_lease_refused_writes_total", nil)
	require.Zero(t, refused, "a lone relay refuses no write")
	_, ok = metric(body, "go_goroutines", nil)
	require.True(t, ok, "runtime metrics exported")
	_, ok = metric(body, "target_info", []string{`service_name="outbox-relay"`})
	require.True(t, ok, "the resource names the service: %s", grepLines(body, "target_info"))

	// SIGTERM: a graceful stop that hands every lease back.
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not stop after SIGTERM")
	}
	require.NoError(t, p.exitErr, "exit code 0 after a graceful stop")
	require.True(t, p.logged("outbox-relay: stopped; leases handed back"))
	view, err := ds.ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "bucket %d still leased after SIGTERM", l.Bucket)
	}
	require.Len(t, view.Relays, 1)
	require.Equal(t, relayID, view.Relays[0].ID)
	require.True(t, view.Relays[0].Stopped(), "the relay stamped itself stopped")
	p.mu.Lock()
	require.Empty(t, p.badLines, "every log line is JSON")
	p.mu.Unlock()
}

// The DynamoDB store's SampleBacklog is the optional capability the relay samples
// the backlog through.
func TestDynamoDBStoreSamplesTheBacklog(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "test")
	// Opening a DynamoDB store makes no request.
	st, err := openStore(context.Background(), storeOptions{DSN: "dynamodb://outbox", Region: "us-east-1", Endpoint: "http://127.0.0.1:1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	_, ok := st.Driver().(driver.BacklogSampler)
	require.True(t, ok, "the DynamoDB store's relay side implements driver.BacklogSampler")
}

func TestRelayBadFlags(t *testing.T) {
	// A store that opens, for the flags checked once it is open.
	db := filepath.Join(t.TempDir(), "outbox.db")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no store: pass -store or set OUTBOX_STORE"},
		{[]string{"-store", "postgres://x"}, "no broker"},
		{[]string{"-store", "redis://x", "-sqs"}, "the scheme must be"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-lease-renew-interval", "1m"}, "-lease-renew-interval is 1m0s; it must be at most a third of -lease-duration (30s)"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-batch-size", "0"}, "-batch-size 0: it must be at least 1"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-max-concurrency", "-1"}, "-max-concurrency -1: it must be at least 1"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-backoff-base", "1m", "-backoff-max", "1s"}, "-backoff-max is 1s; it must be at least -backoff-base (1m0s)"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-max-attempts", "0"}, "-max-attempts 0: it must be at least 1"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-poll-interval", "0s"}, "-poll-interval 0s: it must be positive"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-retention", "-1h"}, "-retention -1h0m0s"},
		{[]string{"-store", "sqlite:" + db, "-kafka-brokers", "127.0.0.1:1", "-metrics-prefix", "9lives"}, "-metrics-prefix"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-table", "bad-name"}, `-table \"bad-name\": each part`},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-buckets", "-3"}, "-buckets -3"},
		{[]string{"-store", "postgres://app:hunter2@[::1", "-kafka-brokers", "127.0.0.1:1"}, "-store"},
		{[]string{"-store", "mysql://root@localhost/test", "-kafka-brokers", "127.0.0.1:1"}, "-store"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-batch-size", "many"}, "-batch-size"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "extra"}, `"extra"`},
		{[]string{"-store", "sqlite:x.db", "-sqs", "-log-level", "loud"}, "-log-level"},
		{[]string{"-store", "dynamodb://outbox", "-aws-region", "us-east-1", "-aws-endpoint", "http://127.0.0.1:1",
			"-kafka-brokers", "127.0.0.1:1", "-retention", "1h"}, "-retention"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-kafka-ack-timeout", "soon"}, "-kafka-ack-timeout"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-kafka-ack-timeout", "0s"}, "-kafka-ack-timeout 0s: it must be positive"},
		// The default ack timeout (10 s) does not fit in a 10 s lease renewed every 3 s.
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-lease-duration", "10s", "-lease-renew-interval", "3s"}, "-kafka-ack-timeout 10s must be under -lease-duration (10s) minus -lease-renew-interval (3s)"},
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-kafka-ack-timeout", "20s"}, "-kafka-ack-timeout 20s must be under"},
		// The log mode's flags.
		{[]string{"-store", "sqlite:x.db", "-kafka-brokers", "127.0.0.1:1", "-log-mode"}, "-log-mode is for PostgreSQL stores"},
		{[]string{"-store", "dynamodb://outbox", "-aws-region", "us-east-1", "-kafka-brokers", "127.0.0.1:1", "-slot", "s"}, "-slot is for PostgreSQL stores"},
		{[]string{"-store", "postgres://127.0.0.1:1/x", "-kafka-brokers", "127.0.0.1:1", "-publication", "p"}, "-publication is a setting of the log mode: add -log-mode"},
		{[]string{"-store", "postgres://127.0.0.1:1/x", "-kafka-brokers", "127.0.0.1:1", "-log-mode", "-slot", "Bad-Slot"}, `-slot \"Bad-Slot\"`},
		{[]string{"-store", "postgres://127.0.0.1:1/x", "-kafka-brokers", "127.0.0.1:1", "-log-mode", "-replication-url", "postgres://app:hunter2@[::1"}, "-replication-url"},
		{[]string{"-store", "postgres://127.0.0.1:1/x", "-kafka-brokers", "127.0.0.1:1", "-stream-retry-budget", "1s"}, "-stream-retry-budget is a setting of the log mode: add -log-mode"},
		{[]string{"-store", "postgres://127.0.0.1:1/x", "-kafka-brokers", "127.0.0.1:1", "-log-mode", "-stream-retry-budget", "-1s"}, "-stream-retry-budget -1s: it must be positive"},
		{[]string{"-store", "postgres://127.0.0.1:1/x", "-kafka-brokers", "127.0.0.1:1", "-log-mode", "-stream-retry-budget", "soon"}, "-stream-retry-budget"},
		// The reader must keep its lease while it retries: under -lease-duration minus -lease-renew-interval.
		{[]string{"-store", "postgres://127.0.0.1:1/x", "-kafka-brokers", "127.0.0.1:1", "-log-mode", "-stream-retry-budget", "25s"}, "-stream-retry-budget is 25s; it must be shorter than -lease-duration − -lease-renew-interval (20s)"},
	} {
		var out strings.Builder
		code := run(context.Background(), append(tc.args, "-listen", ""), &out)
		require.Equal(t, 2, code, "%v: %s", tc.args, out.String())
		require.Contains(t, out.String(), tc.want, "%v", tc.args)
		require.NotContains(t, out.String(), "Config.", "%v: the error names the flag, not a field", tc.args)
		require.NotContains(t, out.String(), "hunter2", "%v: no password in the error", tc.args)
	}
	var out strings.Builder
	require.Equal(t, 0, run(context.Background(), []string{"-help"}, &out))
	for _, f := range []string{"-store", "-kafka-brokers", "-kafka-ack-timeout", "-sqs", "-listen", "-stop-timeout", "-log-mode", "-slot", "-publication", "-replication-url", "-stream-retry-budget", "outbox_messages_slot", "OUTBOX_KAFKA_BROKERS", "/readyz"} {
		require.Contains(t, out.String(), f)
	}
}

// Tables migrated for another bucket count refuse the relay at start, exit 2, in the
// terms of its flags.
func TestRelayRefusesAnotherBucketCount(t *testing.T) {
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	st, err := openStore(context.Background(), storeOptions{DSN: dsn, Buckets: 16})
	require.NoError(t, err)
	require.NoError(t, st.SQL.Migrate(context.Background()))
	require.NoError(t, st.Close())

	var out strings.Builder
	code := run(context.Background(), []string{"-store", dsn, "-kafka-brokers", "127.0.0.1:1", "-listen", ""}, &out)
	require.Equal(t, 2, code, out.String())
	require.Contains(t, out.String(), "migrated for 16 buckets, but this store is built with -buckets 8")
	require.NotContains(t, out.String(), "Config.")
}

// A server without wal_level=logical refuses a relay in log mode at start, exit 2,
// saying how to turn logical decoding on.
func TestRelayInLogModeNeedsLogicalDecoding(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresURL())
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	defer pool.Close()
	var level string
	require.NoError(t, pool.QueryRow(ctx, "SHOW wal_level").Scan(&level))
	if level == "logical" {
		t.Skip("the shared server runs with wal_level=logical")
	}
	table := fmt.Sprintf("relay_test_%08x", rand.Uint32())
	var out strings.Builder
	code := run(ctx, []string{"-store", testenv.PostgresURL(), "-table", table, "-log-mode", "-migrate", "-kafka-brokers", "127.0.0.1:1", "-listen", ""}, &out)
	require.Equal(t, 2, code, out.String())
	require.Contains(t, out.String(), "wal_level = logical")
	var tables int
	require.NoError(t, pool.QueryRow(ctx, "SELECT COUNT(*) FROM pg_tables WHERE tablename LIKE $1", table+"%").Scan(&tables))
	require.Zero(t, tables, "nothing is created on a server that cannot run the log mode")
}

// The metrics' resource names the service: -service-name, else OTEL_SERVICE_NAME,
// else the service.name of OTEL_RESOURCE_ATTRIBUTES, else outbox-relay.
func TestRelayServiceName(t *testing.T) {
	for _, tc := range []struct {
		flag, env, attrs, want string
	}{
		{"", "", "", "outbox-relay"},
		{"", "", "deployment.environment=prod", "outbox-relay"},
		{"", "", "service.name=from-attributes", "from-attributes"},
		{"", "orders-relay", "service.name=from-attributes", "orders-relay"},
		{"billing-relay", "orders-relay", "", "billing-relay"},
	} {
		t.Setenv("OTEL_SERVICE_NAME", tc.env)
		t.Setenv("OTEL_RESOURCE_ATTRIBUTES", tc.attrs)
		registry, provider, err := newMetrics(context.Background(), tc.flag)
		require.NoError(t, err)
		srv := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
		_, body := get(t, srv.URL)
		srv.Close()
		require.NoError(t, provider.Shutdown(context.Background()))
		n, ok := metric(body, "target_info", []string{`service_name="` + tc.want + `"`})
		require.True(t, ok && n == 1, "flag %q, OTEL_SERVICE_NAME %q, OTEL_RESOURCE_ATTRIBUTES %q: want service_name %q in\n%s", tc.flag, tc.env, tc.attrs, tc.want, grepLines(body, "target_info"))
		if tc.attrs == "deployment.environment=prod" {
			require.Contains(t, grepLines(body, "target_info"), `deployment_environment="prod"`, "the environment's other attributes stay")
		}
	}

	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "not an attribute")
	var out strings.Builder
	code := run(context.Background(), []string{"-store", "sqlite:" + filepath.Join(t.TempDir(), "outbox.db"), "-kafka-brokers", "127.0.0.1:1", "-listen", "", "-migrate"}, &out)
	require.Equal(t, 2, code, out.String())
	require.Contains(t, out.String(), "OTEL_RESOURCE_ATTRIBUTES")
}

// grepLines returns the lines of body that start with prefix.
func grepLines(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// In log mode the relay reads the PostgreSQL store's stream: on a cluster of the
// test's own with wal_level=logical, it creates the publication and the slot
// (-migrate), takes the stream lease, publishes every message the writers put into
// the write-ahead log (no row) to Kafka, reports the slot's lag in its metrics, and
// on SIGTERM hands the stream lease back.
func TestRelayInLogMode(t *testing.T) {
	c := pgcluster.Start(t, pgcluster.Logical)
	dsn := c.URL("postgres")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "orders"))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)

	const relayID = "log-relay"
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "")
	p := startRelay(t,
		"-store", dsn, "-log-mode", "-migrate",
		"-kafka-brokers", strings.Join(cluster.ListenAddrs(), ","),
		"-listen", "127.0.0.1:0", "-relay-id", relayID,
		"-poll-interval", "50ms", "-lease-duration", "6s", "-lease-renew-interval", "1s", "-kafka-ack-timeout", "3s",
		"-stream-retry-budget", "1s", "-backlog-interval", "1ms", "-log-level", "debug")
	var addr string
	select {
	case addr = <-p.addr:
	case <-p.done:
		t.Fatalf("the relay exited: %v", p.exitErr)
	case <-time.After(2 * time.Minute):
		t.Fatal("the relay did not report its endpoints")
	}
	base := "http://" + addr
	eventually(t, 60*time.Second, "ready and reading the stream", func() bool {
		code, _ := get(t, base+"/readyz")
		return code == http.StatusOK && p.logged("relay: took the stream lease; reading the stream")
	})

	// The writers: units of work in the log mode, on the slot the relay created.
	pool, err := pgxpool.New(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Mode: sqlstore.LogMode})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	require.NoError(t, err)
	const n = 200
	ids := map[string]bool{}
	for i := range n / 10 {
		require.NoError(t, store.Transact(ctx, func(ctx context.Context) error {
			for j := range 10 {
				id := uuid.New()
				ids[id.String()] = true
				if err := sender.Send(ctx, outbox.Message{ID: id, Topic: "orders", Key: fmt.Appendf(nil, "order-%d", (i*10+j)%37), Payload: fmt.Appendf(nil, "payload %d", i*10+j)}); err != nil {
					return err
				}
			}
			return nil
		}))
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT COUNT(*) FROM "+store.Config().Table).Scan(&rows))
	require.Zero(t, rows, "the log mode writes no row")

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	t.Cleanup(consumer.Close)
	seen := map[string]bool{}
	for len(seen) < n {
		fetches := consumer.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "consumed %d of %d", len(seen), n)
		fetches.EachRecord(func(r *kgo.Record) {
			for _, h := range r.Headers {
				if h.Key == outbox.HeaderMessageID && ids[string(h.Value)] {
					seen[string(h.Value)] = true
				}
			}
		})
	}

	// The metrics: every message sent, a reader on the slot, its lag.
	var body string
	eventually(t, 60*time.Second, "the sends and the stream's gauges", func() bool {
		_, body = get(t, base+"/metrics")
		sent, _ := metric(body, "messaging_client_sent_messages_total", []string{`messaging_destination_name="orders"`}, "error_type")
		active, okA := metric(body, "outbox_stream_active", nil)
		_, okB := metric(body, "outbox_stream_lag_bytes", nil)
		_, okS := metric(body, "outbox_stream_lag_age_seconds", nil)
		return sent >= n && okA && active == 1 && okB && okS
	})
	_, body = get(t, base+"/readyz")
	var ready struct {
		Diverted *int64 `json:"diverted"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &ready))
	require.NotNil(t, ready.Diverted, "/readyz says how many messages went to the table lane: %s", body)
	require.Zero(t, *ready.Diverted, "a broker that takes everything: nothing goes to the table lane")

	// SIGTERM: the stream lease is handed back.
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatal("the relay did not stop after SIGTERM")
	}
	require.NoError(t, p.exitErr, "exit code 0 after a graceful stop")
	var owner string
	require.NoError(t, pool.QueryRow(ctx, "SELECT owner FROM "+store.Config().LeaseTable+" WHERE bucket = $1", driver.StreamLease).Scan(&owner))
	require.Empty(t, owner, "the stream lease is handed back")
	p.mu.Lock()
	require.Empty(t, p.badLines, "every log line is JSON")
	p.mu.Unlock()
}
