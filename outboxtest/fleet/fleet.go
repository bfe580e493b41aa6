// Package fleet is an exported suite that runs relays against a store as a fleet
// does, with real workers on the wall clock, so every store shows the lease
// protocol's promises: quick fair share, graceful stops without refused writes,
// renewals that never wait for a publish, loud mixed bucket counts, store calls with
// deadlines, and a relay that steps aside when it loses its broker.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
)

// callTimeout bounds every store call the suite makes itself.
const callTimeout = 30 * time.Second

// Run runs relays against the store as a fleet does, with real workers on
// the wall clock, and checks what the lease protocol promises on every store:
//
//   - a relay joining a settled fleet holds its fair share within seconds, without
//     waiting for a regular round, and refuses nothing;
//   - a graceful stop hands every bucket to the peer without a refused write;
//   - after a crash the peer takes each bucket just after its lease lapses;
//   - leases renew on their own clock while every publish blocks for twice the renew
//     interval: nothing lapses, nothing is refused;
//   - a round's lease writes run concurrently, MaxConcurrency at a time;
//   - a round that stalls past its leases' expiry cannot renew them: the store refuses
//     a renewal whose clock, read as it is sent, is past the expiry;
//   - relays with different bucket counts on one store all stop with
//     [outbox.ErrMisconfigured], whatever the order of their ids;
//   - store calls that hang hit their deadline and the relay recovers by itself;
//   - a relay cut off from its broker (an [driver.Pinger] that fails) hands its buckets
//     to a peer, parks nothing, and takes its share back once the broker answers;
//   - two relays started under one relay ID both count the clash
//     (relay.Stats.InstanceClashes) and log an ERROR naming both instances, while a
//     relay restarted under its own ID, after a stop or a crash, reports none.
//
// Every subtest gets its own store from h.New. The suite takes about a minute; its
// subtests run in parallel unless h.Sequential is set.
func Run(t *testing.T, h outboxtest.StoreHarness) {
	t.Helper()
	require.NotNil(t, h.New, "StoreHarness.New is required")
	f := fleetSuite{h: h}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"JoinTakesItsShareWithoutWaitingForARound", f.join},
		{"GracefulStopHandsOverWithoutARefusedWrite", f.stop},
		{"CrashHandsOverWhenTheLeasesLapse", f.crash},
		{"LeasesRenewWhileEveryPublishBlocks", f.blockingPublish},
		{"LeaseWritesRunConcurrently", f.concurrentWrites},
		{"LapsedLeaseIsNotRevivedByALateRenewal", f.lateRenewal},
		{"MixedBucketCountsStopEveryRelay", f.mixedCounts},
		{"HungStoreCallsHitTheirDeadline", f.hungStore},
		{"RelayCutOffFromItsBrokerHandsOver", f.cutOffBroker},
		{"SharedRelayIDIsReportedByBothProcesses", f.sharedID},
		{"RestartUnderItsOwnIDIsNoClash", f.restart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !h.Sequential {
				t.Parallel()
			}
			tc.run(t)
		})
	}
}

type fleetSuite struct{ h outboxtest.StoreHarness }

// fleetWithin bounds every wait of the suite: generous, so a busy machine passes.
const fleetWithin = 2 * time.Minute

func (f fleetSuite) store(t *testing.T, buckets int) outboxtest.Store {
	s := f.h.New(t, buckets)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// relay starts a worker that is killed at cleanup.
func (fleetSuite) relay(t *testing.T, s driver.Handle, tr driver.Transport, cfg relay.Config) *relay.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := relay.New(s, tr, cfg)
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(d.Kill)
	return d
}

// quick is a worker configuration with a 3 s lease renewed every second.
func quick(id string) relay.Config {
	return relay.Config{RelayID: id, PollInterval: 50 * time.Millisecond,
		LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second,
		BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
}

// rare makes the regular round so rare (every 100 s) that anything the fleet does
// within the test comes from the watch and the quick rounds.
func rare(id string) relay.Config {
	return relay.Config{RelayID: id, PollInterval: 200 * time.Millisecond,
		LeaseDuration: 5 * time.Minute, LeaseRenewInterval: 100 * time.Second}
}

func waitFor(t *testing.T, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > fleetWithin {
			t.Fatalf("%s: not within %s", what, fleetWithin)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

func refused(ds ...*relay.Relay) (n int64) {
	for _, d := range ds {
		n += d.Stats().RefusedWrites
	}
	return n
}

// settled waits until every relay has run two rounds in a row with no refused write,
// and returns the refusals counted by then.
func settled(t *testing.T, ds ...*relay.Relay) int64 {
	t.Helper()
	rounds := func() []int64 {
		var n []int64
		for _, d := range ds {
			n = append(n, d.Stats().Rounds)
		}
		return n
	}
	base, from := refused(ds...), rounds()
	waitFor(t, "two rounds of every relay without a refused write", func() bool {
		if now := refused(ds...); now != base {
			base, from = now, rounds()
			return false
		}
		for i, r := range rounds() {
			if r < from[i]+2 {
				return false
			}
		}
		return true
	})
	return base
}

func fill(t *testing.T, h driver.Handle, n int) {
	t.Helper()
	s := h.Driver()
	envs := make([]*driver.Envelope, 0, n)
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "fleet", Key: fmt.Appendf(nil, "k%d", i%13), Payload: fmt.Appendf(nil, "m%d", i)}, s.BucketCount())
		require.NoError(t, err)
		envs = append(envs, env)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.NoError(t, s.Enqueue(ctx, envs...))
}

func (f fleetSuite) join(t *testing.T) {
	s := f.store(t, 8)
	a := f.relay(t, s, outboxtest.NewRecorder(), rare("a"))
	waitFor(t, "a holds every bucket", func() bool { return len(a.Owned()) == 8 })
	b := f.relay(t, s, outboxtest.NewRecorder(), rare("b"))
	took := waitFor(t, "b holds its share", func() bool { return len(a.Owned()) == 4 && len(b.Owned()) == 4 })
	t.Logf("join to fair share: %s (regular rounds every 100 s)", took)
	require.Zero(t, refused(a, b), "a join into a settled fleet refuses nothing")
}

func (f fleetSuite) stop(t *testing.T) {
	s := f.store(t, 8)
	a := f.relay(t, s, outboxtest.NewRecorder(), rare("a"))
	waitFor(t, "a holds every bucket", func() bool { return len(a.Owned()) == 8 })
	b := f.relay(t, s, outboxtest.NewRecorder(), rare("b"))
	waitFor(t, "the fleet splits", func() bool { return len(a.Owned()) == 4 && len(b.Owned()) == 4 })
	before := refused(a, b)
	start := time.Now()
	require.NoError(t, a.Stop(context.Background()))
	waitFor(t, "b holds every bucket", func() bool { return len(b.Owned()) == 8 })
	t.Logf("stop to takeover: %s (regular rounds every 100 s)", time.Since(start))
	require.Equal(t, before, refused(a, b), "a graceful stop refuses nothing")
}

func (f fleetSuite) crash(t *testing.T) {
	s := f.store(t, 8)
	a := f.relay(t, s, outboxtest.NewRecorder(), quick("a"))
	waitFor(t, "a holds every bucket", func() bool { return len(a.Owned()) == 8 })
	b := f.relay(t, s, outboxtest.NewRecorder(), quick("b"))
	waitFor(t, "the fleet splits", func() bool { return len(a.Owned()) == 4 && len(b.Owned()) == 4 })
	a.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	view, err := s.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	expiry := map[int]time.Time{}
	for _, l := range view.Leases {
		if l.Owner == "a" {
			expiry[l.Bucket] = l.ExpiresAt
		}
	}
	require.Len(t, expiry, 4)
	start := time.Now()
	for len(expiry) > 0 {
		now := time.Now()
		for _, bk := range b.Owned() {
			if exp, ok := expiry[bk]; ok {
				late := now.Sub(exp)
				t.Logf("bucket %d taken over %s after a's lease lapsed", bk, late)
				// The peer re-plans just after a lapse (1 % of LeaseDuration): 1.05 ×
				// LeaseDuration after the last renewal, and two seconds more for a busy
				// machine's scheduling and store calls.
				require.Less(t, late, 2*time.Second+3*time.Second/20, "bucket %d taken over long after its lease lapsed", bk)
				delete(expiry, bk)
			}
		}
		require.Less(t, time.Since(start), fleetWithin)
		time.Sleep(10 * time.Millisecond)
	}
	require.Len(t, b.Owned(), 8)
}

// blocking holds every Publish call for hold (or until its context ends), then
// acknowledges the batch.
type blocking struct {
	*outboxtest.Recorder
	hold time.Duration
}

func (b blocking) Publish(ctx context.Context, batch []*driver.Envelope) error {
	select {
	case <-time.After(b.hold):
		return b.Recorder.Publish(ctx, batch)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// claims counts lease claims.
type claims struct {
	driver.Store
	n atomic.Int64
}

func (c *claims) Claim(ctx context.Context, bucket int, owner string, now, exp time.Time) (bool, error) {
	c.n.Add(1)
	return c.Store.Claim(ctx, bucket, owner, now, exp)
}

func (c *claims) Driver() driver.Store { return c }

func (f fleetSuite) blockingPublish(t *testing.T) {
	s := &claims{Store: f.store(t, 4).Driver()}
	cfg := func(id string) relay.Config {
		c := quick(id)
		c.BatchSize = 1 // each bucket drains in several calls one after the other: over a lease
		// Publishes still block for twice the renew interval; the longer lease leaves a
		// round room to be late on a busy machine (under -race a SQLite round took
		// over the 2 s a 3 s lease leaves) without a renewal arriving after expiry.
		// Under -race beside a second suite a SQLite round was seen arriving after a
		// 6 s lease had lapsed (its peer then claimed the buckets): 15 s.
		c.LeaseDuration = 15 * time.Second
		// A lease write that outlasts its deadline may still land; the next round's
		// renewal, conditional on the expiry the relay knew, is then refused. Under
		// -race beside other suites a SQLite write took over a second, so the store
		// calls get a third of the lease.
		c.StoreTimeout = c.LeaseDuration / 3
		return c
	}
	tr := blocking{Recorder: outboxtest.NewRecorder(), hold: 2 * time.Second}
	refusals := &refusalLog{}
	ca, cb := cfg("a"), cfg("b")
	ca.Observer, cb.Observer = refusals.of("a"), refusals.of("b")
	a := f.relay(t, s, tr, ca)
	b := f.relay(t, s, tr, cb)
	waitFor(t, "the fleet splits", func() bool { return len(a.Owned()) == 2 && len(b.Owned()) == 2 })
	// A join may lose a claim race or two (a peer's claim or release lands first); what
	// this test is about starts once both relays have run two more rounds with no
	// refusal, so a round still in flight when the split showed is not counted.
	before := settled(t, a, b)
	claimed, filled := s.n.Load(), time.Now()
	// 40 messages over 4 buckets, one 2 s publish each: each bucket drains for about
	// 20 s, longer than a lease, so only renewals during blocked publishes keep it.
	fill(t, s, 40)
	waitFor(t, "every message published", func() bool { return tr.Unique() == 40 })
	require.Equal(t, before, refused(a, b), "no write refused after %s; refused so far: %v",
		filled.Format("15:04:05.000"), refusals.list())
	require.Equal(t, claimed, s.n.Load(), "no lease lapsed and was claimed again")
}

// overlapping measures how many lease writes run at once; each takes 20 ms more.
type overlapping struct {
	driver.Store
	mu       sync.Mutex
	now, max int
}

func (s *overlapping) enter() func() {
	s.mu.Lock()
	s.now++
	s.max = max(s.max, s.now)
	s.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	return func() {
		s.mu.Lock()
		s.now--
		s.mu.Unlock()
	}
}

func (s *overlapping) Claim(ctx context.Context, bucket int, owner string, now, exp time.Time) (bool, error) {
	defer s.enter()()
	return s.Store.Claim(ctx, bucket, owner, now, exp)
}

func (s *overlapping) Renew(ctx context.Context, held driver.Lease, now, exp time.Time) (bool, error) {
	defer s.enter()()
	return s.Store.Renew(ctx, held, now, exp)
}

func (s *overlapping) Driver() driver.Store { return s }

func (f fleetSuite) concurrentWrites(t *testing.T) {
	s := &overlapping{Store: f.store(t, 16).Driver()}
	cfg := quick("a")
	cfg.MaxConcurrency = 4
	d := f.relay(t, s, outboxtest.NewRecorder(), cfg)
	waitFor(t, "a holds every bucket", func() bool { return len(d.Owned()) == 16 })
	s.mu.Lock()
	claimed := s.max
	s.max = 0
	s.mu.Unlock()
	// Each write takes 20 ms: the claims overlap, never more than MaxConcurrency at
	// once (a busy machine may start fewer together).
	require.LessOrEqual(t, claimed, 4, "no more than MaxConcurrency writes at once")
	require.GreaterOrEqual(t, claimed, 2, "16 claims run concurrently")
	waitFor(t, "a round of concurrent renewals", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.max >= 2
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	require.LessOrEqual(t, s.max, 4, "no more than MaxConcurrency renewals at once")
}

// stalling makes the relay's clock jump by jump right after its next coordination
// read, once armed: the round then sends its renewals after its leases lapsed.
type stalling struct {
	driver.Store
	armed  atomic.Bool
	offset atomic.Int64
	jump   time.Duration
}

func (s *stalling) now() time.Time { return time.Now().Add(time.Duration(s.offset.Load())) }

func (s *stalling) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	c, err := s.Store.ReadCoordination(ctx)
	if s.armed.CompareAndSwap(true, false) {
		s.offset.Add(int64(s.jump))
	}
	return c, err
}

func (s *stalling) Driver() driver.Store { return s }

func (f fleetSuite) lateRenewal(t *testing.T) {
	cfg := quick("a")
	s := &stalling{Store: f.store(t, 2).Driver(), jump: cfg.LeaseDuration + time.Second}
	cfg.Now = s.now
	d := f.relay(t, s, outboxtest.NewRecorder(), cfg)
	waitFor(t, "a holds every bucket", func() bool { return len(d.Owned()) == 2 })
	before := d.Stats().RefusedWrites
	s.armed.Store(true)
	waitFor(t, "the late renewals are refused", func() bool { return d.Stats().RefusedWrites >= before+2 })
	require.Equal(t, before+2, d.Stats().RefusedWrites, "one refused renewal per lapsed lease")
	waitFor(t, "the buckets are claimed afresh", func() bool { return len(d.Owned()) == 2 })
}

// countAs reports another bucket count, as a relay configured for another count
// would see the store.
type countAs struct {
	driver.Store
	n int
}

func (c countAs) BucketCount() int { return c.n }

func (c countAs) Driver() driver.Store { return c }

func (f fleetSuite) mixedCounts(t *testing.T) {
	for _, ids := range [][2]string{{"a", "b"}, {"b", "a"}} {
		t.Run(fmt.Sprintf("8-bucket relay %s, 16-bucket relay %s", ids[0], ids[1]), func(t *testing.T) {
			s := f.store(t, 8)
			eight := f.relay(t, s, outboxtest.NewRecorder(), quick(ids[0]))
			waitFor(t, "the 8-bucket relay runs", func() bool { return len(eight.Owned()) == 8 })
			sixteen := f.relay(t, countAs{s.Driver(), 16}, outboxtest.NewRecorder(), quick(ids[1]))
			for _, d := range []*relay.Relay{eight, sixteen} {
				select {
				case <-d.Stopped():
				case <-time.After(fleetWithin):
					t.Fatalf("relay %s still runs beside a relay with another bucket count", d.RelayID())
				}
				require.ErrorIs(t, d.Err(), outbox.ErrMisconfigured)
				require.ErrorContains(t, d.Err(), "with 8 buckets")
				require.ErrorContains(t, d.Err(), "with 16 buckets")
			}
		})
	}
}

// hanging makes the relay's reads hang until their context ends while open, as a
// connection whose packets are dropped does.
type hanging struct {
	driver.Store
	open     atomic.Bool
	timedOut atomic.Int64
}

func (h *hanging) hang(ctx context.Context) error {
	if !h.open.Load() {
		return nil
	}
	<-ctx.Done()
	h.timedOut.Add(1)
	return ctx.Err()
}

func (h *hanging) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	if err := h.hang(ctx); err != nil {
		return driver.Batch{}, err
	}
	return h.Store.Fetch(ctx, bucket, limit)
}

func (h *hanging) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	if err := h.hang(ctx); err != nil {
		return driver.Coordination{}, err
	}
	return h.Store.ReadCoordination(ctx)
}

func (h *hanging) ReadRelays(ctx context.Context) ([]driver.RelayRecord, error) {
	if err := h.hang(ctx); err != nil {
		return nil, err
	}
	return h.Store.ReadRelays(ctx)
}

func (h *hanging) Driver() driver.Store { return h }

func (f fleetSuite) hungStore(t *testing.T) {
	inner := f.store(t, 2)
	s := &hanging{Store: inner.Driver()}
	tr := outboxtest.NewRecorder()
	d := f.relay(t, s, tr, quick("a"))
	waitFor(t, "the relay holds its buckets", func() bool { return len(d.Owned()) == 2 })
	s.open.Store(true)
	waitFor(t, "store calls time out", func() bool { return s.timedOut.Load() >= 3 })
	fill(t, inner, 10)
	s.open.Store(false)
	waitFor(t, "the relay publishes again", func() bool { return tr.Unique() == 10 })
	require.NoError(t, d.Err())
}

// severable is a transport whose broker can be cut off: publishes fail, transient,
// and pings fail.
type severable struct {
	*outboxtest.Recorder
	cut atomic.Bool
}

var errBrokerUnreachable = errors.New("outboxtest: broker unreachable")

func (c *severable) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if c.cut.Load() {
		return errBrokerUnreachable
	}
	return c.Recorder.Publish(ctx, batch)
}

func (c *severable) Ping(context.Context) error {
	if c.cut.Load() {
		return errBrokerUnreachable
	}
	return nil
}

func (f fleetSuite) cutOffBroker(t *testing.T) {
	s := f.store(t, 4)
	cfg := func(id string) relay.Config {
		c := quick(id)
		c.MaxAttempts = 2 // attempts run out long before the lease
		return c
	}
	cutTr := &severable{Recorder: outboxtest.NewRecorder()}
	goodTr := &severable{Recorder: outboxtest.NewRecorder()}
	a := f.relay(t, s, cutTr, cfg("a"))
	b := f.relay(t, s, goodTr, cfg("b"))
	waitFor(t, "the fleet splits", func() bool { return len(a.Owned()) == 2 && len(b.Owned()) == 2 })
	cutTr.cut.Store(true)
	fill(t, s, 40)
	took := waitFor(t, "the peer publishes everything", func() bool { return goodTr.Unique() == 40 })
	t.Logf("cut off to all published by the peer: %s (LeaseDuration 3 s)", took)
	require.Zero(t, a.Stats().Parked+b.Stats().Parked, "nothing parked")
	require.Empty(t, a.Owned())
	require.Positive(t, a.Stats().Retried, "the cut-off relay did try")
	cutTr.cut.Store(false)
	waitFor(t, "the relay takes its share back", func() bool { return len(a.Owned()) == 2 && len(b.Owned()) == 2 })
	require.NoError(t, a.Err())
}

// refusalLog records which conditional writes were refused, by which relay and when,
// so a failure says which write it was.
type refusalLog struct {
	mu  sync.Mutex
	log []string
}

type refusalObserver struct {
	relay.NopObserver
	id  string
	log *refusalLog
}

func (l *refusalLog) of(id string) relay.Observer { return refusalObserver{id: id, log: l} }

func (o refusalObserver) RefusedWrite(_ context.Context, op string) {
	o.log.mu.Lock()
	defer o.log.mu.Unlock()
	o.log.log = append(o.log.log, fmt.Sprintf("%s %s at %s", o.id, op, time.Now().Format("15:04:05.000")))
}

func (l *refusalLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.log)
}
