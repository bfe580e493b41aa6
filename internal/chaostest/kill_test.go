package chaostest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

const (
	killTopic   = "orders"
	killBuckets = 8
	killLease   = 2 * time.Second
	killRenew   = 500 * time.Millisecond
)

// relayProc is one relay process and what it printed.
type relayProc struct {
	id     string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	exited chan struct{}
	err    error // the process's exit status, once exited is closed

	mu        sync.Mutex
	ready     bool
	acked     chan struct{} // receives (without blocking) on every "acked" line
	owned     []int
	published int64
	// history holds every ownership report, with the time the test read it.
	history []ownership
}

type ownership struct {
	at    time.Time
	owned []int
}

func (p *relayProc) snapshot() (ready bool, owned []int, published int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready, slices.Clone(p.owned), p.published
}

// firstOwned is when the relay first reported owning bucket at or after since.
func (p *relayProc) firstOwned(bucket int, since time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, h := range p.history {
		if !h.at.Before(since) && slices.Contains(h.owned, bucket) {
			return h.at, true
		}
	}
	return time.Time{}, false
}

func (p *relayProc) read(t *testing.T, out *bufio.Scanner) {
	for out.Scan() {
		f := strings.Fields(out.Text())
		now := time.Now()
		p.mu.Lock()
		switch {
		case len(f) == 2 && f[0] == "ready":
			p.ready = true
		case len(f) == 2 && f[0] == "acked":
			select {
			case p.acked <- struct{}{}:
			default:
			}
		case len(f) >= 3 && f[0] == "owned":
			p.published, _ = strconv.ParseInt(f[2], 10, 64)
			p.owned = nil
			if len(f) == 4 {
				for _, s := range strings.Split(f[3], ",") {
					b, err := strconv.Atoi(s)
					if err == nil {
						p.owned = append(p.owned, b)
					}
				}
			}
			p.history = append(p.history, ownership{at: now, owned: slices.Clone(p.owned)})
		}
		p.mu.Unlock()
	}
}

// buildRelay compiles ./relay into a temporary directory.
func buildRelay(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		unavailable(t, "a go toolchain to build the relay binary", err)
	}
	bin := filepath.Join(t.TempDir(), "relay")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command(goBin, append(args, "./relay")...).CombinedOutput()
	require.NoError(t, err, "go build ./relay: %s", out)
	return bin
}

func startRelay(t *testing.T, bin, id string, args ...string) *relayProc {
	t.Helper()
	p := &relayProc{id: id, exited: make(chan struct{}), acked: make(chan struct{}, 1)}
	p.cmd = exec.Command(bin, append([]string{"-id", id}, args...)...)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, p.cmd.Start())
	go func() {
		p.read(t, bufio.NewScanner(stdout))
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
			t.Logf("relay %s stderr:\n%s", id, p.stderr.String())
		}
	})
	return p
}

// fleet is a PostgreSQL store and a Kafka cluster that relay processes share.
type fleet struct {
	store   *sqlstore.Store
	cluster *kfake.Cluster
	bin     string
	args    []string
}

// newFleet migrates fresh tables, starts a Kafka cluster and builds the relay; the
// relays it starts use lease and renew.
func newFleet(t *testing.T, lease, renew time.Duration) *fleet {
	t.Helper()
	ctx := context.Background()
	pool := postgresPool(t, 8)
	table := uniqueTable("kill")
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: table, BucketCount: killBuckets})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	t.Cleanup(func() {
		_ = store.Close()
		_ = store.DropTables(context.Background())
	})

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(killBuckets, killTopic))
	require.NoError(t, err)
	t.Cleanup(cluster.Close)
	for _, addr := range cluster.ListenAddrs() {
		require.True(t, strings.HasPrefix(addr, "127.0.0.1:"), "the cluster must listen on loopback, got %s", addr)
	}
	return &fleet{store: store, cluster: cluster, bin: buildRelay(t), args: []string{
		"-postgres", postgresURL(), "-table", table, "-brokers", strings.Join(cluster.ListenAddrs(), ","),
		"-buckets", strconv.Itoa(killBuckets), "-lease", lease.String(), "-renew", renew.String(),
	}}
}

func (f *fleet) start(t *testing.T, id string, extra ...string) *relayProc {
	t.Helper()
	return startRelay(t, f.bin, id, append(slices.Clone(f.args), extra...)...)
}

// waitSplit waits until every bucket is owned by exactly one of relays, each of which
// owns some.
func waitSplit(t *testing.T, relays []*relayProc, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		seen := map[int]int{}
		for _, p := range relays {
			ready, owned, _ := p.snapshot()
			if !ready || len(owned) == 0 {
				return false
			}
			for _, b := range owned {
				seen[b]++
			}
		}
		if len(seen) != killBuckets {
			return false
		}
		for _, n := range seen {
			if n != 1 {
				return false
			}
		}
		return true
	}, within, 20*time.Millisecond, "the relays never split the buckets")
}

// TestKilledRelayProcessLosesNothing runs three relay processes against PostgreSQL
// and a Kafka cluster, SIGKILLs one while it publishes, and checks that its buckets
// move to the survivors only after its lease lapsed, and that every committed message
// reaches Kafka, first deliveries of each key in commit order.
func TestKilledRelayProcessLosesNothing(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, killLease, killRenew)
	store, cluster := f.store, f.cluster
	slow := []string{"-publish-delay", "5ms", "-ack-delay", "30ms", "-batch", "20"}
	relays := []*relayProc{
		f.start(t, "relay-a", slow...),
		f.start(t, "relay-b", slow...),
		f.start(t, "relay-c", slow...),
	}

	// Wait for the fleet to settle: every bucket owned, by exactly one relay.
	waitSplit(t, relays, 20*time.Second)

	// One writer commits units of work (a tenth rolled back) for a few seconds.
	type unit struct{ key, seq int }
	var (
		wmu        sync.Mutex
		committed  = map[unit]bool{}
		rolledBack = map[unit]bool{}
		writeErr   error
	)
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	require.NoError(t, err)
	writeCtx, stopWriting := context.WithCancel(ctx)
	defer stopWriting()
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		rng := rand.New(rand.NewPCG(7, 7))
		seq := map[int]int{}
		for writeCtx.Err() == nil {
			var msgs []unit
			for range 20 {
				k := rng.IntN(256)
				seq[k]++
				msgs = append(msgs, unit{k, seq[k]})
			}
			rollback := rng.IntN(10) == 0
			err := store.Transact(ctx, func(ctx context.Context) error {
				for _, m := range msgs {
					err := sender.Send(ctx, outbox.Message{Topic: killTopic, Key: fmt.Appendf(nil, "key-%d", m.key), Payload: fmt.Appendf(nil, "%d:%d", m.key, m.seq)})
					if err != nil {
						return err
					}
				}
				if rollback {
					return errRolledBack
				}
				return nil
			})
			wmu.Lock()
			for _, m := range msgs {
				switch {
				case err == nil:
					committed[m] = true
				case errors.Is(err, errRolledBack):
					rolledBack[m] = true
				default:
					writeErr = err
				}
			}
			wmu.Unlock()
			if err != nil && !errors.Is(err, errRolledBack) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	// Kill the relay that owns bucket 0 right after the broker acknowledged one of its
	// batches, before the relay could tell the store: that batch must come again.
	time.Sleep(1500 * time.Millisecond)
	var victim *relayProc
	for _, p := range relays {
		if _, owned, _ := p.snapshot(); slices.Contains(owned, 0) {
			victim = p
		}
	}
	require.NotNil(t, victim)
	select {
	case <-victim.acked: // drop an acknowledgement from before
	default:
	}
	select {
	case <-victim.acked:
	case <-time.After(10 * time.Second):
		t.Fatal("the victim published nothing")
	}
	require.NoError(t, victim.cmd.Process.Signal(syscall.SIGKILL))
	killedAt := time.Now()
	<-victim.exited
	_, _, published := victim.snapshot()

	// The dead relay's leases as it left them: they name it until they lapse.
	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	expiry := map[int]time.Time{}
	var victimBuckets []int
	for _, l := range view.Leases {
		if l.Owner == victim.id {
			expiry[l.Bucket] = l.ExpiresAt
			victimBuckets = append(victimBuckets, l.Bucket)
		}
	}
	require.NotEmpty(t, victimBuckets, "the victim held no lease when it was killed")
	t.Logf("killed %s holding buckets %v after it published %d messages", victim.id, victimBuckets, published)

	// Every bucket of the victim moves to a survivor, and not before its lease lapsed.
	var survivors []*relayProc
	for _, p := range relays {
		if p != victim {
			survivors = append(survivors, p)
		}
	}
	moved := map[int]time.Time{}
	require.Eventually(t, func() bool {
		for _, b := range victimBuckets {
			for _, s := range survivors {
				if at, ok := s.firstOwned(b, killedAt); ok {
					if prev, seen := moved[b]; !seen || at.Before(prev) {
						moved[b] = at
					}
				}
			}
		}
		return len(moved) == len(victimBuckets)
	}, killLease+5*time.Second, 20*time.Millisecond, "the victim's buckets never moved to a survivor")
	for b, at := range moved {
		t.Logf("bucket %d moved %s after the kill; the lease lapsed %s after it", b,
			at.Sub(killedAt).Round(time.Millisecond), expiry[b].Sub(killedAt).Round(time.Millisecond))
		require.False(t, at.Before(expiry[b]), "bucket %d moved before the victim's lease lapsed", b)
	}

	time.Sleep(time.Second) // the survivors carry the load for a while
	stopWriting()
	<-writerDone
	require.NoError(t, writeErr)
	require.NotEmpty(t, rolledBack)

	// Read everything back from Kafka.
	consumer, err := kgo.NewClient(
		kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics(killTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond),
	)
	require.NoError(t, err)
	defer consumer.Close()
	delivered := map[unit]int{}
	lastFirst := map[int]int{}
	deliveries, duplicates, outOfOrder := 0, 0, 0
	readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for len(delivered) < len(committed) && readCtx.Err() == nil {
		fetches := consumer.PollFetches(readCtx)
		fetches.EachRecord(func(rec *kgo.Record) {
			d, err := kafkatransport.Decode(rec)
			require.NoError(t, err)
			var m unit
			_, err = fmt.Sscanf(string(d.Payload), "%d:%d", &m.key, &m.seq)
			require.NoError(t, err)
			deliveries++
			if delivered[m]++; delivered[m] > 1 {
				duplicates++
				return
			}
			require.False(t, rolledBack[m], "rolled back message %v was delivered", m)
			require.True(t, committed[m], "message %v was never committed", m)
			if m.seq <= lastFirst[m.key] {
				outOfOrder++
			}
			lastFirst[m.key] = m.seq
		})
	}
	missing := 0
	for m := range committed {
		if delivered[m] == 0 {
			missing++
		}
	}
	t.Logf("committed %d, rolled back %d, deliveries %d, duplicates %d, missing %d, out of order %d",
		len(committed), len(rolledBack), deliveries, duplicates, missing, outOfOrder)
	require.Zero(t, missing, "committed messages missing from Kafka")
	require.Zero(t, outOfOrder, "first deliveries out of commit order")
	require.Positive(t, duplicates, "the batch acknowledged just before the kill must have been published again")

	// The store empties (the survivors complete what Kafka acknowledged), and the
	// survivors stop gracefully.
	require.Eventually(t, func() bool {
		for b := range killBuckets {
			head, err := store.Driver().Fetch(ctx, b, 10)
			if err != nil || len(head.Envelopes) > 0 {
				return false
			}
		}
		return true
	}, 10*time.Second, 20*time.Millisecond, "the store still holds messages after they reached Kafka")
	for _, s := range survivors {
		require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case <-s.exited:
			require.NoError(t, s.err, "relay %s: %s", s.id, s.stderr.String())
		case <-time.After(15 * time.Second):
			t.Fatalf("relay %s did not stop after SIGTERM", s.id)
		}
	}
}

var errRolledBack = errors.New("rolled back on purpose")

// TestStoppedRelayProcessHandsBucketsOver: a relay process stopped with SIGTERM, whose
// Stop is given the signal's context, already cancelled (the `defer d.Stop(ctx)`
// pattern), still stamps itself stopped and hands its leases back: it exits cleanly,
// and the other relay owns every bucket long before the stopped relay's leases would
// have lapsed, not LeaseDuration later as after a crash.
func TestStoppedRelayProcessHandsBucketsOver(t *testing.T) {
	ctx := context.Background()
	// A lease far longer than a round: a hand-over that waited for it to lapse would
	// fail the test, whatever the machine's load.
	const lease, renew = 30 * time.Second, 500 * time.Millisecond
	f := newFleet(t, lease, renew)
	a, b := f.start(t, "relay-a"), f.start(t, "relay-b")
	waitSplit(t, []*relayProc{a, b}, 20*time.Second)

	view, err := f.store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	var lapse time.Time // when the first of a's leases would lapse
	for _, l := range view.Leases {
		if l.Owner == a.id && (lapse.IsZero() || l.ExpiresAt.Before(lapse)) {
			lapse = l.ExpiresAt
		}
	}
	require.False(t, lapse.IsZero(), "relay-a holds no lease")

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	stoppedAt := time.Now()
	select {
	case <-a.exited:
		require.NoError(t, a.err, "relay-a: %s", a.stderr.String())
	case <-time.After(15 * time.Second):
		t.Fatal("relay-a did not stop after SIGTERM")
	}
	view, err = f.store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, r := range view.Relays {
		if r.ID == a.id {
			require.True(t, r.Stopped(), "relay-a is stamped stopped")
		}
	}

	require.Eventually(t, func() bool {
		_, owned, _ := b.snapshot()
		return len(owned) == killBuckets
	}, time.Until(lapse), 20*time.Millisecond, "relay-b did not take every bucket before relay-a's leases lapsed")
	t.Logf("relay-b owned every bucket %s after the SIGTERM; relay-a's leases would have lapsed %s after it",
		time.Since(stoppedAt).Round(time.Millisecond), lapse.Sub(stoppedAt).Round(time.Millisecond))

	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-b.exited:
		require.NoError(t, b.err, "relay-b: %s", b.stderr.String())
	case <-time.After(15 * time.Second):
		t.Fatal("relay-b did not stop after SIGTERM")
	}
}
