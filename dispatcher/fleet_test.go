package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memory"
)

// eventually polls cond until it holds or within passes, failing with what.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// slowRoundConfig makes the regular round so rare (every 100 s) that anything the
// fleet does within seconds comes from the watch and the quick rounds.
func slowRoundConfig(id string) Config {
	return Config{
		RelayID:            id,
		PollInterval:       200 * time.Millisecond,
		LeaseDuration:      5 * time.Minute,
		LeaseRenewInterval: 100 * time.Second,
		Logger:             quietLogger(),
	}
}

func startWorker(t *testing.T, store outbox.DispatchStore, tr outbox.Transport, cfg Config) *Dispatcher {
	t.Helper()
	d := newDispatcher(t, store, tr, cfg)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(d.Kill)
	return d
}

func TestJoiningRelayTakesItsShareWithoutWaitingForARound(t *testing.T) {
	t.Parallel()
	store := newStore(t, 8)
	a := startWorker(t, store, outboxtest.NewRecorder(), slowRoundConfig("a"))
	eventually(t, 30*time.Second, "a holds every bucket", func() bool { return len(a.Owned()) == 8 })
	b := startWorker(t, store, outboxtest.NewRecorder(), slowRoundConfig("b"))
	took := eventually(t, 30*time.Second, "b holds its share", func() bool {
		return len(a.Owned()) == 4 && len(b.Owned()) == 4
	})
	t.Logf("join to fair share: %s (regular rounds every 100 s)", took)
	require.Zero(t, a.Stats().RefusedWrites+b.Stats().RefusedWrites, "a join into a settled fleet refuses nothing")
}

func TestGracefulStopHandsOverWithoutWaitingForARound(t *testing.T) {
	t.Parallel()
	store := newStore(t, 8)
	a := startWorker(t, store, outboxtest.NewRecorder(), slowRoundConfig("a"))
	b := startWorker(t, store, outboxtest.NewRecorder(), slowRoundConfig("b"))
	eventually(t, 30*time.Second, "the fleet splits", func() bool { return len(a.Owned()) == 4 && len(b.Owned()) == 4 })
	refusedBefore := a.Stats().RefusedWrites + b.Stats().RefusedWrites
	start := time.Now()
	require.NoError(t, a.Stop(context.Background()))
	eventually(t, 30*time.Second, "b holds every bucket", func() bool { return len(b.Owned()) == 8 })
	t.Logf("stop to takeover: %s (regular rounds every 100 s)", time.Since(start))
	require.Equal(t, refusedBefore, a.Stats().RefusedWrites+b.Stats().RefusedWrites, "a graceful stop refuses nothing")
}

// blockingTransport takes hold for every Publish call (or until its context ends),
// then acknowledges the batch.
type blockingTransport struct {
	*outboxtest.Recorder
	hold time.Duration
}

func (b blockingTransport) Publish(ctx context.Context, batch []*outbox.Envelope) error {
	select {
	case <-time.After(b.hold):
		return b.Recorder.Publish(ctx, batch)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// claimCounter counts claims per relay.
type claimCounter struct {
	*memory.Store
	claims atomic.Int64
}

func (c *claimCounter) Claim(ctx context.Context, bucket int, owner string, now, exp time.Time) (bool, error) {
	c.claims.Add(1)
	return c.Store.Claim(ctx, bucket, owner, now, exp)
}

// Renewals never wait for a publish: with every Publish call blocking for twice the
// renew interval, no lease lapses (nobody claims again after the first split) and no
// write is refused.
func TestLeasesRenewWhileEveryPublishBlocks(t *testing.T) {
	t.Parallel()
	store := &claimCounter{Store: newStore(t, 4)}
	cfg := func(id string) Config {
		c := workerConfig(id)
		c.LeaseDuration, c.LeaseRenewInterval = 3*time.Second, time.Second
		c.BatchSize = 2 // each bucket drains in five calls one after the other: over three leases
		return c
	}
	tr := blockingTransport{Recorder: outboxtest.NewRecorder(), hold: 2 * time.Second}
	a := startWorker(t, store, tr, cfg("a"))
	b := startWorker(t, store, tr, cfg("b"))
	eventually(t, 30*time.Second, "the fleet splits", func() bool { return len(a.Owned()) == 2 && len(b.Owned()) == 2 })
	claims := store.claims.Load()
	refused := a.Stats().RefusedWrites + b.Stats().RefusedWrites // two relays starting at once may collide, once
	envs := enqueue(t, store, nil, 40)
	eventually(t, 2*time.Minute, "every message published", func() bool { return len(tr.Messages()) >= len(envs) })
	require.Equal(t, refused, a.Stats().RefusedWrites+b.Stats().RefusedWrites)
	require.Equal(t, claims, store.claims.Load(), "no lease lapsed and was claimed again")
}

// countAs makes a store report another bucket count, as a relay configured for
// another count would see its tables.
type countAs struct {
	*memory.Store
	n int
}

func (c countAs) BucketCount() int { return c.n }

func TestMixedBucketCountsStopEveryRelay(t *testing.T) {
	t.Parallel()
	for _, ids := range [][2]string{{"a", "b"}, {"b", "a"}} {
		t.Run(fmt.Sprintf("8-bucket relay %s, 16-bucket relay %s", ids[0], ids[1]), func(t *testing.T) {
			t.Parallel()
			store := newStore(t, 8)
			eight := startWorker(t, store, outboxtest.NewRecorder(), workerConfig(ids[0]))
			eventually(t, 30*time.Second, "the 8-bucket relay runs", func() bool { return len(eight.Owned()) == 8 })
			sixteen := startWorker(t, countAs{store, 16}, outboxtest.NewRecorder(), workerConfig(ids[1]))
			for _, d := range []*Dispatcher{eight, sixteen} {
				select {
				case <-d.Stopped():
				case <-time.After(30 * time.Second):
					t.Fatalf("relay %s still runs beside a relay with another bucket count", d.RelayID())
				}
				require.ErrorIs(t, d.Err(), outbox.ErrMisconfigured)
				require.ErrorContains(t, d.Err(), "with 8 buckets")
				require.ErrorContains(t, d.Err(), "with 16 buckets")
			}
		})
	}
}

// blackHole makes every store call hang until its context ends while it is open, as
// a connection whose packets are dropped does.
type blackHole struct {
	*memory.Store
	open     atomic.Bool
	timedOut atomic.Int64
}

func (h *blackHole) hang(ctx context.Context) error {
	if !h.open.Load() {
		return nil
	}
	<-ctx.Done()
	h.timedOut.Add(1)
	return ctx.Err()
}

func (h *blackHole) Fetch(ctx context.Context, bucket, limit int) ([]*outbox.Envelope, error) {
	if err := h.hang(ctx); err != nil {
		return nil, err
	}
	return h.Store.Fetch(ctx, bucket, limit)
}

func (h *blackHole) ReadCoordination(ctx context.Context) (outbox.Coordination, error) {
	if err := h.hang(ctx); err != nil {
		return outbox.Coordination{}, err
	}
	return h.Store.ReadCoordination(ctx)
}

func (h *blackHole) ReadRelays(ctx context.Context) ([]outbox.RelayRecord, error) {
	if err := h.hang(ctx); err != nil {
		return nil, err
	}
	return h.Store.ReadRelays(ctx)
}

// A store call that hangs is cut at its deadline: the relay keeps running, and
// recovers by itself once the store answers again.
func TestHungStoreCallsHitTheirDeadlineAndTheRelayRecovers(t *testing.T) {
	t.Parallel()
	store := &blackHole{Store: newStore(t, 2)}
	tr := outboxtest.NewRecorder()
	cfg := workerConfig("a")
	cfg.LeaseDuration, cfg.LeaseRenewInterval = 3*time.Second, time.Second
	d := startWorker(t, store, tr, cfg)
	eventually(t, 30*time.Second, "the relay holds its buckets", func() bool { return len(d.Owned()) == 2 })

	store.open.Store(true)
	eventually(t, time.Minute, "store calls time out", func() bool { return store.timedOut.Load() >= 3 })
	envs := enqueue(t, store.Store, nil, 10)
	store.open.Store(false)
	eventually(t, time.Minute, "the relay publishes again", func() bool { return len(tr.Messages()) == len(envs) })
	require.NoError(t, d.Err())
}

// inFlight measures how many lease writes run at once.
type inFlight struct {
	*memory.Store
	mu       sync.Mutex
	now, max int
}

func (s *inFlight) write() func() {
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

func (s *inFlight) Claim(ctx context.Context, bucket int, owner string, now, exp time.Time) (bool, error) {
	defer s.write()()
	return s.Store.Claim(ctx, bucket, owner, now, exp)
}

func (s *inFlight) Renew(ctx context.Context, held outbox.Lease, now, exp time.Time) (bool, error) {
	defer s.write()()
	return s.Store.Renew(ctx, held, now, exp)
}

func TestLeaseWritesRunConcurrently(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 16)
	store := &inFlight{Store: f.store}
	cfg := Config{RelayID: "a", LeaseDuration: testLD, LeaseRenewInterval: testRI, MaxConcurrency: 4,
		Logger: quietLogger(), Now: f.clock.Now}
	a, err := New(store, outboxtest.NewRecorder(), cfg)
	require.NoError(t, err)
	_, err = a.coordinate(context.Background())
	require.NoError(t, err)
	require.Len(t, a.Owned(), 16)
	require.Equal(t, 4, store.max, "16 claims run MaxConcurrency at a time")
	f.clock.Advance(testRI)
	store.max = 0
	_, err = a.coordinate(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, store.max, "16 renewals run MaxConcurrency at a time")
}

// crashAfter makes relay "a" die after its n-th store write of a round: the write
// and every later call of "a" fail.
type crashAfter struct {
	*memory.Store
	mu        sync.Mutex
	n, writes int
	dead      bool
}

var errCrashed = errors.New("crashed")

func (c *crashAfter) write(owner string) error {
	if owner != "a" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || c.writes >= c.n {
		c.dead = true
		return errCrashed
	}
	c.writes++
	return nil
}

func (c *crashAfter) Heartbeat(ctx context.Context, relay string, at time.Time, n int) (bool, error) {
	if err := c.write(relay); err != nil {
		return false, err
	}
	return c.Store.Heartbeat(ctx, relay, at, n)
}

func (c *crashAfter) Renew(ctx context.Context, held outbox.Lease, now, exp time.Time) (bool, error) {
	if err := c.write(held.Owner); err != nil {
		return false, err
	}
	return c.Store.Renew(ctx, held, now, exp)
}

// A relay that dies at any point of a round (before, between or after its renewals,
// before or after its heartbeat) loses each bucket to a peer within 1.05 ×
// LeaseDuration of that bucket's last renewal: its heartbeat lapses no later than its
// leases, and the peer re-plans just after a lapse instead of at its next round.
func TestCrashAtAnyPointOfARoundHandsOverWithinTheLease(t *testing.T) {
	t.Parallel()
	const renewals = 4 // "a" holds 4 of 8 buckets: 4 renewals, then the heartbeat
	for n := 0; n <= renewals+1; n++ {
		t.Run(fmt.Sprintf("dies after %d writes", n), func(t *testing.T) {
			f := newFleet(t, 8)
			crash := &crashAfter{Store: f.store, n: 1 << 30}
			mk := func(id string) *Dispatcher {
				d, err := New(crash, outboxtest.NewRecorder(), Config{RelayID: id, LeaseDuration: testLD,
					LeaseRenewInterval: testRI, Logger: quietLogger(), Now: f.clock.Now})
				require.NoError(t, err)
				return d
			}
			a, b := mk("a"), mk("b")
			ctx := context.Background()
			for range 4 {
				for _, d := range []*Dispatcher{a, b} {
					_, err := d.coordinate(ctx)
					require.NoError(t, err)
				}
				f.clock.Advance(testRI)
			}
			require.Len(t, a.Owned(), 4)

			crash.mu.Lock()
			crash.n, crash.writes = n, 0
			crash.mu.Unlock()
			_, err := a.coordinate(ctx)
			if n <= renewals {
				require.ErrorIs(t, err, errCrashed)
			} else {
				require.NoError(t, err, "dies right after its heartbeat")
			}
			view, err := f.store.ReadCoordination(ctx)
			require.NoError(t, err)
			deadline := map[int]time.Time{}
			for _, l := range view.Leases {
				if l.Owner == "a" {
					deadline[l.Bucket] = l.ExpiresAt.Add(testLD / 20) // last renewal + 1.05 × LeaseDuration
				}
			}

			// b runs its rounds half a renew interval out of step with a's, when its
			// loop would (lapse rounds included), until it holds everything.
			f.clock.Advance(testRI / 2)
			for len(b.Owned()) < 8 {
				plan, err := b.coordinate(ctx)
				require.NoError(t, err)
				for _, bk := range b.Owned() {
					if dl, ok := deadline[bk]; ok {
						require.False(t, f.clock.Now().After(dl), "bucket %d taken over at %s, after %s", bk, f.clock.Now(), dl)
						delete(deadline, bk)
					}
				}
				require.Less(t, f.clock.Now().Sub(epoch), 10*testLD, "b never took everything")
				f.clock.Advance(b.roundDelay(plan))
			}
			require.Empty(t, deadline)
		})
	}
}

// cuttable is a transport whose broker can be cut off: publishes fail with a
// transient error and pings fail.
type cuttable struct {
	*outboxtest.Recorder
	cut atomic.Bool
}

var errUnreachable = errors.New("broker unreachable")

func (c *cuttable) Publish(ctx context.Context, batch []*outbox.Envelope) error {
	if c.cut.Load() {
		return errUnreachable
	}
	return c.Recorder.Publish(ctx, batch)
}

func (c *cuttable) Ping(context.Context) error {
	if c.cut.Load() {
		return errUnreachable
	}
	return nil
}

// A relay cut off from its broker (not from the store) hands its buckets to a peer
// that can publish, parks nothing meanwhile although attempts run out, and takes its
// share back once its broker answers.
func TestRelayCutOffFromItsBrokerHandsOverAndParksNothing(t *testing.T) {
	t.Parallel()
	store := newStore(t, 4)
	cfg := func(id string) Config {
		c := workerConfig(id)
		c.LeaseDuration, c.LeaseRenewInterval = 3*time.Second, time.Second
		c.MaxAttempts = 2 // attempts run out long before the lease
		return c
	}
	cutTr := &cuttable{Recorder: outboxtest.NewRecorder()}
	goodTr := &cuttable{Recorder: outboxtest.NewRecorder()}
	a := startWorker(t, store, cutTr, cfg("a"))
	b := startWorker(t, store, goodTr, cfg("b"))
	eventually(t, 30*time.Second, "the fleet splits", func() bool { return len(a.Owned()) == 2 && len(b.Owned()) == 2 })

	cutTr.cut.Store(true)
	envs := enqueue(t, store, nil, 40)
	took := eventually(t, time.Minute, "the peer publishes everything", func() bool { return len(goodTr.Messages()) == len(envs) })
	t.Logf("cut off to all published by the peer: %s (LeaseDuration 3 s)", took)
	require.Zero(t, a.Stats().Parked+b.Stats().Parked, "nothing parked")
	require.Empty(t, a.Owned())
	require.Positive(t, a.Stats().Retried, "the cut-off relay did try")

	cutTr.cut.Store(false)
	eventually(t, time.Minute, "the relay takes its share back", func() bool { return len(a.Owned()) == 2 && len(b.Owned()) == 2 })
	require.NoError(t, a.Err())
}
