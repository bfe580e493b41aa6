package chaostest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest/netfault"
	"github.com/outboxkit/outbox/relay"
)

// The chaos runs of the SQL store's log mode, each on a PostgreSQL cluster of the
// test's own with wal_level=logical and a Kafka cluster, with writers committing keyed
// units throughout (PostgreSQL itself killed mid-stream is
// store/sqlstore/internal/logtests' TestPostgresKilledMidStream). Every run ends with
// the same checks: every committed message delivered at least once (or, for a poison
// key, parked), first deliveries of every key in commit order, nothing parked that a
// transient fault caused, and the slot's confirmed position never ahead of what the
// broker acknowledged or the table lane holds (requireSlotBehindAcks).

// everyMessage selects every message.
func everyMessage(uuid.UUID) bool { return true }

// TestLogModeReaderKilledStandbyTakesOver runs three relay processes on a log-mode
// store and SIGKILLs whichever holds the stream lease, three times: each time after it
// read for a while, right after the broker acknowledged one of its publishes (before
// it could confirm the stream past it); a fresh process starts after each kill. A
// standby takes the stream once the dead reader's lease lapsed, and not before, within
// half a lease of it (it looks every PollInterval); every committed message reaches
// Kafka, first deliveries in commit order, and what the killed readers had published
// without confirming comes again.
func TestLogModeReaderKilledStandbyTakesOver(t *testing.T) {
	const (
		lease = 2 * time.Second
		renew = 500 * time.Millisecond
		poll  = 20 * time.Millisecond
		kills = 3
	)
	ctx := context.Background()
	rig := newLogRig(t)
	bin := buildRelay(t)
	args := []string{"-log-mode", "-postgres", rig.cluster.URL("postgres"), "-table", rig.store.Config().Table,
		"-brokers", strings.Join(rig.kafka.ListenAddrs(), ","), "-buckets", strconv.Itoa(killBuckets),
		"-lease", lease.String(), "-renew", renew.String(), "-poll", poll.String(), "-batch", "50",
		// The kill lands between the broker's acknowledgement and the relay hearing of it.
		"-ack-delay", "50ms"}
	live := map[string]*relayProc{}
	started := 0
	start := func() {
		id := fmt.Sprintf("relay-%d", started)
		started++
		live[id] = startRelay(t, bin, id, args...)
	}
	for range 3 {
		start()
	}

	sampler := rig.sampleSlot(t, 50*time.Millisecond)
	stopWriting := rig.write(t, logKeys(32), 2, 20*time.Millisecond)

	for kill := range kills {
		// The reader: a live relay holding the stream lease, with the slot open.
		var id string
		var pid int32
		require.Eventually(t, func() bool {
			owner, exp, err := rig.streamLease(ctx)
			if err != nil || live[owner] == nil || !exp.After(time.Now()) {
				return false
			}
			pid, err = rig.slotReader(ctx)
			id = owner
			return err == nil && pid != 0
		}, 5*lease, 10*time.Millisecond, "no relay reads the stream")
		// Let it read for a while (it confirms batches), then kill it right after an
		// acknowledgement.
		victim := live[id]
		time.Sleep(lease/4 + time.Duration(rand.Int64N(int64(lease/2))))
		select {
		case <-victim.acked: // an acknowledgement from before
		default:
		}
		select {
		case <-victim.acked:
		case <-time.After(5 * lease):
			t.Fatalf("the reader %s published nothing", id)
		}
		require.NoError(t, victim.cmd.Process.Signal(syscall.SIGKILL))
		killedAt := time.Now()
		<-victim.exited
		delete(live, id)
		owner, lapse, err := rig.streamLease(ctx)
		require.NoError(t, err)
		require.Equal(t, id, owner, "the killed reader held the stream lease")

		// A standby takes the lease once it lapsed and opens the slot (the server let
		// go of the dead reader's WAL sender when its connection closed). It looks every
		// PollInterval: half a lease after the lapse is ample on a busy machine, and a
		// take-over that waited for another lease to pass would miss it.
		deadline := lapse.Add(lease / 2)
		var next string
		var nextExp, takenAt time.Time
		for takenAt.IsZero() && time.Now().Before(deadline.Add(lease)) {
			o, exp, err := rig.streamLease(ctx)
			if err == nil && o != id && live[o] != nil && exp.After(time.Now()) {
				if p, err := rig.slotReader(ctx); err == nil && p != 0 && p != pid {
					next, nextExp, takenAt = o, exp, time.Now()
					break
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		require.False(t, takenAt.IsZero(), "kill %d: no standby took the stream from %s", kill+1, id)
		t.Logf("kill %d: %s killed; its lease lapsed %s later; %s read the stream %s after the kill",
			kill+1, id, lapse.Sub(killedAt).Round(time.Millisecond), next, takenAt.Sub(killedAt).Round(time.Millisecond))
		require.False(t, takenAt.After(deadline), "kill %d: %s took the stream %s after %s's lease lapsed, more than half a lease (%s)",
			kill+1, next, takenAt.Sub(lapse).Round(time.Millisecond), id, lease/2)
		// The lease's expiry is its claim (or last renewal) plus the lease: the claim
		// came after the dead reader's lease lapsed.
		require.False(t, nextExp.Add(-lease).Before(lapse), "kill %d: %s claimed the stream before %s's lease lapsed", kill+1, next, id)
		start()
	}

	time.Sleep(lease) // the last reader carries the load for a while
	ledger := stopWriting()
	first, copies := rig.readKafka(t, ledger, everyMessage, 15*lease)
	t.Logf("committed %d, rolled back %d, %d copies in Kafka (%d duplicates)", len(ledger.committed), len(ledger.rolledBack), copies, copies-len(first))
	requireDelivered(t, ledger, first, everyMessage)
	commits := rig.commits(t)
	requireSlotBehindAcks(t, sampler.finish(t, commits, 5*lease), commits, first, ledger)
	require.Greater(t, copies, len(first), "what a killed reader published without confirming came again")
	require.Empty(t, rig.parked(t), "nothing is parked")

	for id, p := range live {
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		select {
		case <-p.exited:
			require.NoError(t, p.err, "relay %s: %s", id, p.stderr.String())
		case <-time.After(5 * lease):
			t.Fatalf("relay %s did not stop after SIGTERM", id)
		}
	}
}

// startLogRelay starts an in-process relay on a handle of its own, stopped at the
// test's end.
func startLogRelay(t *testing.T, rig *logRig, tr driver.Transport, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Logger = testLogger(t, cfg.RelayID)
	r, err := relay.New(rig.handle(t), tr, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

// TestLogModeBrokerDownForSeconds cuts the connections of two relays to Kafka (a
// fault proxy refusing and breaking every connection) for a few seconds while the
// stream runs. The reader's publishes fail past StreamRetryBudget, so messages go to
// the table lane with every later message of their keys; once the broker is back the
// table lane delivers them without parking any (MaxAttempts is set beyond what the
// outage can use), the keys stream again, nothing is lost and key order holds across
// the two lanes.
func TestLogModeBrokerDownForSeconds(t *testing.T) {
	const (
		lease   = 3 * time.Second
		renew   = time.Second
		poll    = 50 * time.Millisecond
		budget  = 500 * time.Millisecond
		backoff = 100 * time.Millisecond
		outage  = 3 * time.Second
	)
	rig := newLogRig(t)
	proxies := map[string]*netfault.Proxy{}
	for _, addr := range rig.kafka.ListenAddrs() {
		proxies[addr] = netfault.New(t, addr)
	}
	dial := func(ctx context.Context, network, host string) (net.Conn, error) {
		px, ok := proxies[host]
		if !ok {
			return nil, fmt.Errorf("no proxy for %s", host)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, px.Addr())
	}
	// Backoffs only grow from BackoffBase less the jitter (0.2), so an envelope is
	// tried at most once per that while the broker is away: MaxAttempts above that
	// over the outage and two leases more is never reached by it.
	maxAttempts := 2 + int((outage+2*lease)/(backoff*8/10))
	cfg := func(id string) relay.Config {
		return relay.Config{
			RelayID: id, BatchSize: 50, PollInterval: poll, LeaseDuration: lease, LeaseRenewInterval: renew,
			StreamRetryBudget: budget, BackoffBase: backoff, BackoffMax: time.Second, MaxAttempts: maxAttempts,
		}
	}
	relays := []*relay.Relay{
		startLogRelay(t, rig, rig.kafkaTransport(t, dial), cfg("relay-a")),
		startLogRelay(t, rig, rig.kafkaTransport(t, dial), cfg("relay-b")),
	}

	sampler := rig.sampleSlot(t, 50*time.Millisecond)
	stopWriting := rig.write(t, logKeys(16), 2, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		sampler.mu.Lock()
		defer sampler.mu.Unlock()
		return len(sampler.samples) >= 3
	}, 5*lease, 10*time.Millisecond, "the stream never ran")

	for _, px := range proxies {
		px.Cut()
	}
	time.Sleep(outage)
	for _, px := range proxies {
		px.Restore()
	}
	time.Sleep(lease) // writers go on after the broker came back
	ledger := stopWriting()

	first, copies := rig.readKafka(t, ledger, everyMessage, outage+10*lease)
	var diverted int64
	for _, r := range relays {
		diverted += r.Stats().Diverted
	}
	t.Logf("committed %d, rolled back %d, %d copies in Kafka, %d diverted to the table lane", len(ledger.committed), len(ledger.rolledBack), copies, diverted)
	requireDelivered(t, ledger, first, everyMessage)
	commits := rig.commits(t)
	requireSlotBehindAcks(t, sampler.finish(t, commits, 5*lease), commits, first, ledger)
	require.Positive(t, diverted, "the outage outlasted StreamRetryBudget: messages went to the table lane")
	require.Empty(t, rig.parked(t), "nothing is parked for an outage of a few seconds")
	require.Eventually(t, func() bool { return rig.rows(t) == 0 }, 5*lease, 20*time.Millisecond, "the table lane drained")
}

const (
	poisonKey = "poison" // the broker refuses every message of it, permanently
	stuckKey  = "stuck"  // the broker refuses the first message of it, every time, as a transient failure
)

var (
	errPoison = errors.New("the broker refuses this key for good")
	errStuck  = errors.New("the broker refuses this message")
)

// refusals decides, for every relay's transport, what the broker refuses, and keeps
// every attempt in the order the relays made them.
type refusals struct {
	mu       sync.Mutex
	stuck    uuid.UUID // the first message of stuckKey the relays tried
	attempts []attempt
}

type attempt struct {
	id      uuid.UUID
	key     string
	refused bool
}

// refusingTransport is the real Kafka transport, but for the messages the refusals
// refuse: those fail without reaching the broker.
type refusingTransport struct {
	next driver.Transport
	r    *refusals
}

// Ping implements driver.Pinger: the broker answers.
func (t *refusingTransport) Ping(ctx context.Context) error {
	return t.next.(driver.Pinger).Ping(ctx)
}

func (t *refusingTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	var pass []*driver.Envelope
	var failed []driver.MessageError
	t.r.mu.Lock()
	for _, e := range batch {
		var err error
		switch string(e.Key) {
		case poisonKey:
			err = driver.Permanent(errPoison)
		case stuckKey:
			if t.r.stuck == uuid.Nil {
				t.r.stuck = e.ID
			}
			if e.ID == t.r.stuck {
				err = errStuck
			}
		}
		t.r.attempts = append(t.r.attempts, attempt{id: e.ID, key: string(e.Key), refused: err != nil})
		if err != nil {
			failed = append(failed, driver.MessageError{ID: e.ID, Err: err})
		} else {
			pass = append(pass, e)
		}
	}
	t.r.mu.Unlock()
	var err error
	if len(pass) > 0 {
		err = t.next.Publish(ctx, pass)
	}
	if len(failed) == 0 {
		return err
	}
	var pe *driver.PublishError
	switch {
	case errors.As(err, &pe):
		failed = append(failed, pe.Failed...)
	case err != nil:
		for _, e := range pass {
			failed = append(failed, driver.MessageError{ID: e.ID, Err: err})
		}
	}
	return &driver.PublishError{Failed: failed}
}

// TestLogModePoisonKey runs two relays whose broker refuses every message of one key
// permanently, and the first message of another key every time (transiently). The
// poison key's messages go to the table lane and are parked there, each once; the
// stuck message goes to the table lane after StreamRetryBudget, with the later
// messages of its key behind it, and is parked after MaxAttempts, after which those
// are delivered and the key streams again. Every other key keeps streaming (none of
// its messages ever enters the table) and is delivered in commit order, and no relay
// ever tries a message of a key before an earlier one of the key is settled.
func TestLogModePoisonKey(t *testing.T) {
	const (
		lease       = 3 * time.Second
		renew       = time.Second
		poll        = 50 * time.Millisecond
		budget      = 300 * time.Millisecond
		backoff     = 100 * time.Millisecond
		maxAttempts = 4
	)
	rig := newLogRig(t)
	refused := &refusals{}
	cfg := func(id string) relay.Config {
		return relay.Config{
			RelayID: id, BatchSize: 50, PollInterval: poll, LeaseDuration: lease, LeaseRenewInterval: renew,
			StreamRetryBudget: budget, BackoffBase: backoff, BackoffMax: 4 * backoff, MaxAttempts: maxAttempts,
		}
	}
	var relays []*relay.Relay
	for _, id := range []string{"relay-a", "relay-b"} {
		relays = append(relays, startLogRelay(t, rig, &refusingTransport{next: rig.kafkaTransport(t, nil), r: refused}, cfg(id)))
	}

	sampler := rig.sampleSlot(t, 50*time.Millisecond)
	keys := append(logKeys(10), poisonKey, stuckKey)
	stopWriting := rig.write(t, keys, 2, 10*time.Millisecond)
	// Writers go on until the stuck message is parked (after StreamRetryBudget and
	// MaxAttempts tries spaced by at most BackoffMax), and a while after, so the stuck
	// key streams again.
	finder := rig.store.Driver().(driver.Finder)
	require.Eventually(t, func() bool {
		refused.mu.Lock()
		id := refused.stuck
		refused.mu.Unlock()
		env, err := finder.Find(context.Background(), id)
		return err == nil && env.Status == driver.Parked
	}, budget+maxAttempts*4*backoff+3*lease, 20*time.Millisecond, "the stuck message was never parked")
	time.Sleep(lease / 2)
	ledger := stopWriting()

	// What is parked: every poison message, and the stuck one.
	bad := map[uuid.UUID]bool{}
	for _, id := range ledger.byKey[poisonKey] {
		bad[id] = true
	}
	require.NotEmpty(t, ledger.byKey[stuckKey])
	stuck := ledger.byKey[stuckKey][0]
	bad[stuck] = true
	good := func(id uuid.UUID) bool { return !bad[id] }
	// The stuck message is parked after MaxAttempts tries spaced by at most
	// BackoffMax; the messages held behind it follow.
	first, copies := rig.readKafka(t, ledger, good, time.Duration(maxAttempts)*4*backoff+10*lease)
	t.Logf("committed %d (%d of the poison key, %d of the stuck key), rolled back %d, %d copies in Kafka",
		len(ledger.committed), len(ledger.byKey[poisonKey]), len(ledger.byKey[stuckKey]), len(ledger.rolledBack), copies)
	requireDelivered(t, ledger, first, good)
	for id := range bad {
		_, ok := first[id]
		require.False(t, ok, "a refused message reached Kafka")
	}

	// Admin sees the parked ones: each poison message once, the stuck one after
	// MaxAttempts.
	var parked []*driver.Envelope
	require.Eventually(t, func() bool {
		parked = rig.parked(t)
		return len(parked) == len(bad) && rig.rows(t) == len(bad)
	}, 5*lease, 20*time.Millisecond, "the refused messages are parked in the table, and nothing else is left there")
	for _, e := range parked {
		require.True(t, bad[e.ID], "parked: %s", e.Payload)
		if e.ID == stuck {
			require.Equal(t, maxAttempts, e.Attempts, "the stuck message was parked after MaxAttempts")
			require.Contains(t, e.LastError, errStuck.Error())
		} else {
			require.Contains(t, e.LastError, errPoison.Error())
		}
	}

	// No key's message was tried before an earlier one of the key was settled: across
	// the lanes, each key's attempts never go back in commit order.
	refused.mu.Lock()
	attempts, firstStuck := slices.Clone(refused.attempts), refused.stuck
	refused.mu.Unlock()
	require.Equal(t, stuck, firstStuck, "the first stuck message tried is the first committed")
	latest := map[string]int{}
	for _, a := range attempts {
		seq := ledger.committed[a.id].seq
		require.GreaterOrEqual(t, seq, latest[a.key], "key %s: #%d tried after #%d", a.key, seq, latest[a.key])
		latest[a.key] = seq
	}
	// The stuck key's later messages stayed behind it: none was tried before its
	// last refusal.
	lastStuck := -1
	for i, a := range attempts {
		if a.id == stuck {
			lastStuck = i
		}
	}
	require.NotEqual(t, -1, lastStuck)
	for i, a := range attempts[:lastStuck] {
		require.False(t, a.key == stuckKey && a.id != stuck, "attempt %d: a later stuck message was tried before the stuck one was parked", i)
	}

	// Every other key kept streaming: none of its messages ever entered the table.
	commits := rig.commits(t)
	samples := sampler.finish(t, commits, 5*lease)
	for _, s := range samples {
		for id := range s.table {
			m := ledger.committed[id]
			require.True(t, m.key == poisonKey || m.key == stuckKey, "a message of %s went to the table lane", m.key)
		}
	}
	requireSlotBehindAcks(t, samples, commits, first, ledger)

	// Every poison message went through the table lane, and so did the stuck one with
	// the messages committed behind it while it was there, but not the stuck key's
	// later ones: the key streamed again.
	var diverted int64
	for _, r := range relays {
		diverted += r.Stats().Diverted
	}
	poison, stuckKeyed := len(ledger.byKey[poisonKey]), len(ledger.byKey[stuckKey])
	t.Logf("%d diverted to the table lane", diverted)
	require.Greater(t, diverted, int64(poison+1), "later messages of the stuck key were held behind it in the table lane")
	require.Less(t, diverted, int64(poison+stuckKeyed), "the stuck key streamed again once it was parked")
}
