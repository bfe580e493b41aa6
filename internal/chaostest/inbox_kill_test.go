package chaostest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// consumerProc is one consumer process (./consumer) and what it printed.
type consumerProc struct {
	id     string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	exited chan struct{}
	err    error

	mu         sync.Mutex
	ready      bool
	committed  int
	duplicates int
	// onCommit receives (without blocking) on every committed line.
	onCommit chan struct{}
}

func (p *consumerProc) counts() (ready bool, committed, duplicates int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready, p.committed, p.duplicates
}

func buildConsumer(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		unavailable(t, "a go toolchain to build the consumer binary", err)
	}
	bin := filepath.Join(t.TempDir(), "consumer")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goBin, append(args, "./consumer")...).CombinedOutput()
	require.NoError(t, err, "go build ./consumer: %s", out)
	return bin
}

func startConsumer(t *testing.T, bin, id string, args ...string) *consumerProc {
	t.Helper()
	p := &consumerProc{id: id, exited: make(chan struct{}), onCommit: make(chan struct{}, 1)}
	p.cmd = exec.Command(bin, append([]string{"-id", id}, args...)...)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			p.mu.Lock()
			switch {
			case len(f) == 2 && f[0] == "ready":
				p.ready = true
			case len(f) == 3 && f[0] == "committed":
				p.committed++
				if f[2] == "true" {
					p.duplicates++
				}
				select {
				case p.onCommit <- struct{}{}:
				default:
				}
			}
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("consumer %s stderr:\n%s", id, p.stderr.String())
		}
	})
	return p
}

func (p *consumerProc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.exited
}

// stop sends SIGTERM and requires a clean exit.
func (p *consumerProc) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatalf("consumer %s did not stop within a minute of SIGTERM", p.id)
	}
	require.NoError(t, p.err, "consumer %s exits cleanly on SIGTERM: %s", p.id, p.stderr.String())
}

// inboxRig is a PostgreSQL store with an effects table and a Kafka cluster that
// consumer processes share.
type inboxRig struct {
	pool    *pgxpool.Pool
	store   *sqlstore.Store
	effects string
	cluster *kfake.Cluster
	bin     string
	args    []string
}

func newInboxRig(t *testing.T, topics ...string) *inboxRig {
	t.Helper()
	ctx := context.Background()
	pool := postgresPool(t, 8)
	table := uniqueTable("inboxkill")
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: table})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	effects := table + "_effects"
	_, err = pool.Exec(ctx, "CREATE TABLE "+effects+" (msg_id TEXT NOT NULL, proc TEXT NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = store.Close()
		_ = store.DropTables(context.Background())
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+effects)
	})
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, topics...), kfake.GroupMinSessionTimeout(500*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	return &inboxRig{pool: pool, store: store, effects: effects, cluster: cluster, bin: buildConsumer(t), args: []string{
		"-postgres", postgresURL(), "-table", table, "-effects", effects,
		"-brokers", strings.Join(cluster.ListenAddrs(), ","), "-session", "2s",
	}}
}

// publish sends n keyed messages to topic through the outbox's Kafka transport and
// returns their ids.
func (r *inboxRig) publish(t *testing.T, topic string, n int) map[string]bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.cluster.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	tr, err := kafkatransport.New(cl, kafkatransport.Config{})
	require.NoError(t, err)
	ids := map[string]bool{}
	var envs []*driver.Envelope
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: []byte(fmt.Sprint("key-", i%17)), Payload: []byte(fmt.Sprint(i))}, driver.DefaultBucketCount)
		require.NoError(t, err)
		envs = append(envs, env)
		ids[env.ID.String()] = true
	}
	require.NoError(t, tr.Publish(context.Background(), envs))
	return ids
}

func (r *inboxRig) start(t *testing.T, id string, extra ...string) *consumerProc {
	t.Helper()
	return startConsumer(t, r.bin, id, append(append([]string(nil), r.args...), extra...)...)
}

// effectCounts returns how many effects each message id has.
func (r *inboxRig) effectCounts(t *testing.T) map[string]int {
	t.Helper()
	rows, err := r.pool.Query(context.Background(), "SELECT msg_id, COUNT(*) FROM "+r.effects+" GROUP BY msg_id")
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		require.NoError(t, rows.Scan(&id, &n))
		out[id] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// waitApplied waits until every id has an effect, and returns the counts.
func (r *inboxRig) waitApplied(t *testing.T, ids map[string]bool, within time.Duration) map[string]int {
	t.Helper()
	var counts map[string]int
	require.Eventually(t, func() bool {
		counts = r.effectCounts(t)
		for id := range ids {
			if counts[id] == 0 {
				return false
			}
		}
		return true
	}, within, 50*time.Millisecond, "every message's effect is applied")
	return counts
}

func requireOnce(t *testing.T, ids map[string]bool, counts map[string]int) {
	t.Helper()
	for id := range ids {
		require.Equal(t, 1, counts[id], "message %s: its effect must be applied exactly once", id)
	}
}

// TestInboxSurvivesKilledConsumers SIGKILLs consumer processes (two share a consumer
// group) between a unit's commit and its offset commit, and at random points, and
// checks that every message's effect is applied exactly once: none lost, none twice.
func TestInboxSurvivesKilledConsumers(t *testing.T) {
	const topic, n = "payments", 400
	r := newInboxRig(t, topic)
	ids := r.publish(t, topic, n)
	common := []string{"-topic", topic, "-group", "billing", "-consumer", "billing", "-max-poll", "10"}
	paused := append([]string{"-pause", "300ms"}, common...)

	// Kills between the commit and the offset commit: the process sleeps in the
	// Processed hook, after its unit committed and before the poll's offsets are
	// committed, and is killed there.
	began := time.Now()
	survivor := r.start(t, "survivor", common...)
	procs := []*consumerProc{survivor}
	for i := range 3 {
		victim := r.start(t, fmt.Sprint("after-commit-", i), paused...)
		procs = append(procs, victim)
		select {
		case <-victim.onCommit:
		case <-victim.exited:
			t.Fatalf("consumer exited before processing: %v", victim.err)
		case <-time.After(2 * time.Minute):
			t.Fatalf("consumer %s processed nothing within two minutes", victim.id)
		}
		victim.kill(t)
		t.Logf("%v: killed %s after a commit", time.Since(began).Round(time.Millisecond), victim.id)
	}

	// Kills at random points.
	rng := rand.New(rand.NewPCG(14, 14))
	for i := range 3 {
		victim := r.start(t, fmt.Sprint("random-", i), common...)
		procs = append(procs, victim)
		time.Sleep(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		victim.kill(t)
		t.Logf("%v: killed %s", time.Since(began).Round(time.Millisecond), victim.id)
	}

	counts := r.waitApplied(t, ids, 3*time.Minute)
	t.Logf("%v: every effect applied", time.Since(began).Round(time.Millisecond))
	requireOnce(t, ids, counts)
	require.Len(t, counts, n, "no effect of an unknown message")
	survivor.stop(t)
	totalDups := 0
	for _, p := range procs {
		_, _, d := p.counts()
		totalDups += d
	}
	// A record whose unit committed in a killed process was redelivered, its offset
	// never committed, and found a duplicate.
	require.Positive(t, totalDups, "the records of the units killed before their offset commit were redelivered and skipped")
}

// TestInboxTwoConsumerProcessesRaceOnEveryKey runs two consumer processes in
// different consumer groups under one consumer name: both receive every message and
// race on every key. Each message's effect is applied once.
func TestInboxTwoConsumerProcessesRaceOnEveryKey(t *testing.T) {
	const topic, n = "refunds", 200
	r := newInboxRig(t, topic)
	ids := r.publish(t, topic, n)
	common := []string{"-topic", topic, "-consumer", "refunds", "-max-poll", "5", "-handler-time", "2ms"}
	a := r.start(t, "a", append([]string{"-group", "race-a"}, common...)...)
	b := r.start(t, "b", append([]string{"-group", "race-b"}, common...)...)
	require.Eventually(t, func() bool {
		_, ca, _ := a.counts()
		_, cb, _ := b.counts()
		return ca >= n && cb >= n
	}, 3*time.Minute, 50*time.Millisecond, "both processes process every message (applied or duplicate)")
	a.stop(t)
	b.stop(t)
	counts := r.effectCounts(t)
	requireOnce(t, ids, counts)
	_, _, da := a.counts()
	_, _, db := b.counts()
	require.Equal(t, n, 2*n-da-db, "between them, the two processes applied each message once and skipped it once")
}
