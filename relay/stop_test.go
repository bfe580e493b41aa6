package relay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// stopping is a fleet of two relays on the fake clock: "a" runs the worker, with one
// batch stuck in flight (so it cannot end on its own), and "b" is driven round by
// round. ctx is the context "a" was started with, as a signal context would be.
type stopping struct {
	*fleet
	a, b   *Relay
	ctx    context.Context
	cancel context.CancelFunc
	env    *driver.Envelope
}

func newStopping(t *testing.T) *stopping {
	t.Helper()
	f := newFleet(t, 8)
	stuck := stuckTransport{entered: make(chan struct{}, 1)}
	s := &stopping{fleet: f, a: f.addWith("a", stuck), b: f.add("b")}
	for range 3 {
		f.round("a", "b")
		f.clock.Advance(testRI)
	}
	require.Equal(t, []int{4, 4}, f.shares("a", "b"))

	// One message in a bucket of "a".
	mine := map[int]bool{}
	for _, b := range s.a.Owned() {
		mine[b] = true
	}
	for i := 0; s.env == nil; i++ {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte{byte(i)}, Payload: []byte("x")}, f.store.Driver().BucketCount())
		require.NoError(t, err)
		if mine[env.Bucket] {
			s.env = env
		}
	}
	require.NoError(t, f.store.Driver().Enqueue(context.Background(), s.env))

	s.ctx, s.cancel = context.WithCancel(context.Background())
	t.Cleanup(s.cancel)
	require.NoError(t, s.a.Start(s.ctx))
	select {
	case <-stuck.entered: // "a" renewed its leases and has the batch in flight
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not publish")
	}
	require.Len(t, s.a.Owned(), 4)
	return s
}

// leasesOf returns the buckets whose stored lease names relay, lapsed or not.
func (s *stopping) leasesOf(relay string) []int {
	s.t.Helper()
	view, err := s.store.Driver().ReadCoordination(context.Background())
	require.NoError(s.t, err)
	var out []int
	for _, l := range view.Leases {
		if l.Owner == relay {
			out = append(out, l.Bucket)
		}
	}
	return out
}

func (s *stopping) relayStopped(relay string) bool {
	s.t.Helper()
	view, err := s.store.Driver().ReadCoordination(context.Background())
	require.NoError(s.t, err)
	for _, r := range view.Relays {
		if r.ID == relay {
			return r.Stopped()
		}
	}
	return false
}

// `defer d.Stop(ctx)` with the signal context Start got runs with a context that is
// already cancelled: the batch in flight is cancelled, but the leases are still handed
// back, so the peer takes them on its next round rather than after LeaseDuration.
func TestStopWithCancelledContextStillHandsTheBucketsOver(t *testing.T) {
	t.Parallel()
	s := newStopping(t)
	held := s.a.Owned()

	s.cancel() // the shutdown signal
	require.ErrorIs(t, s.a.Stop(s.ctx), context.Canceled, "Stop returns its context's error")
	select {
	case <-s.a.Stopped():
	default:
		t.Fatal("Stopped is not closed after Stop")
	}
	require.Empty(t, s.leasesOf("a"), "the leases were handed back")
	require.True(t, s.relayStopped("a"), "the relay was stamped stopped")

	s.clock.Advance(time.Second) // far less than LeaseDuration
	s.round("b")
	require.Len(t, s.b.Owned(), 8, "the peer holds every bucket after one round")
	require.Subset(t, s.b.Owned(), held)
	require.Zero(t, s.b.Stats().RefusedWrites)

	env, err := find(context.Background(), s.store, s.env.ID)
	require.NoError(t, err)
	require.Equal(t, driver.Pending, env.Status)
	require.Zero(t, env.Attempts, "a batch cut short by Stop costs no attempt")

	require.NoError(t, s.a.Stop(context.Background()), "stopping twice is a no-op")
	require.NoError(t, s.a.Err())
}

// Kill is a crash: nothing is handed back, and the peer gets the buckets only once the
// leases lapse.
func TestKillLeavesTheLeasesToLapse(t *testing.T) {
	t.Parallel()
	s := newStopping(t)
	held := s.a.Owned()

	s.a.Kill()
	select {
	case <-s.a.Stopped():
	default:
		t.Fatal("Stopped is not closed after Kill")
	}
	require.Equal(t, held, s.leasesOf("a"), "Kill hands nothing back")
	require.False(t, s.relayStopped("a"), "Kill does not stamp the relay stopped")
	require.NoError(t, s.a.Stop(context.Background()), "Stop after Kill does nothing")
	require.Equal(t, held, s.leasesOf("a"), "Stop after Kill does nothing")
	require.ErrorIs(t, s.a.Start(context.Background()), outbox.ErrClosed)

	s.clock.Advance(time.Second)
	s.round("b")
	require.Len(t, s.b.Owned(), 4, "the killed relay's buckets stay with it while its leases last")
	s.clock.Advance(testLD)
	s.round("b")
	require.Len(t, s.b.Owned(), 8, "once the leases lapse the peer takes them")
}

func TestKillBeforeStartKeepsTheWorkerFromStarting(t *testing.T) {
	t.Parallel()
	d := newDispatcher(t, newStore(t, 2), outboxtest.NewRecorder(), workerConfig("w"))
	require.NoError(t, d.Stop(context.Background()), "Stop before Start is a no-op")
	d.Kill()
	require.ErrorIs(t, d.Start(context.Background()), outbox.ErrClosed)
}

// A release the store refuses is reported by Stop, and a second Stop retries it.
func TestStopRetriesAFailedRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 2)
	flaky := &flakyStore{memDriver: relaySide(store)}
	d := newDispatcher(t, flaky, outboxtest.NewRecorder(), workerConfig("w"))
	require.NoError(t, d.Start(ctx))
	waitFor(t, "buckets", func() bool { return len(d.Owned()) == 2 })

	flaky.down.Store(true)
	require.ErrorIs(t, d.Stop(ctx), errStoreDown)
	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Equal(t, "w", l.Owner, "the failed release left the leases")
	}

	flaky.down.Store(false)
	require.NoError(t, d.Stop(ctx), "a retried Stop releases")
	view, err = store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner)
	}
}

// slowReleases is a store whose first three lease releases run past any deadline, as
// writes on a busy store do, and whose later ones answer at once.
type slowReleases struct {
	memDriver
	calls atomic.Int64
}

func (s *slowReleases) Driver() driver.Store { return s }

func (s *slowReleases) Release(ctx context.Context, held driver.Lease) (bool, error) {
	if s.calls.Add(1) <= 3 {
		<-ctx.Done()
		return false, ctx.Err()
	}
	return s.memDriver.Release(ctx, held)
}

// Releases that run past StoreTimeout do not end a graceful stop whose own context
// has room: Stop tries again (more than once) and hands every lease back.
func TestStopTriesASlowReleaseAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 2)
	slow := &slowReleases{memDriver: relaySide(store)}
	cfg := workerConfig("w")
	cfg.StoreTimeout = 50 * time.Millisecond
	d := newDispatcher(t, slow, outboxtest.NewRecorder(), cfg)
	require.NoError(t, d.Start(ctx))
	waitFor(t, "buckets", func() bool { return len(d.Owned()) == 2 })

	require.NoError(t, d.Stop(ctx))
	require.GreaterOrEqual(t, slow.calls.Load(), int64(5), "the slow releases were tried again")
	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "bucket %d was handed back", l.Bucket)
	}
}

// cancellingTransport cancels the sweep's context from inside a publish, as a
// scheduler's deadline would.
type cancellingTransport struct{ cancel context.CancelFunc }

func (c cancellingTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	c.cancel()
	return ctx.Err()
}

func TestRunOnceCutShortStillReleases(t *testing.T) {
	t.Parallel()
	c := newClock()
	store := newStore(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := newDispatcher(t, store, cancellingTransport{cancel}, testConfig(c, "sweeper"))
	enqueue(t, store, []byte("k"), 1)

	_, err := d.RunOnce(ctx)
	require.ErrorIs(t, err, context.Canceled)
	view, err := store.Driver().ReadCoordination(context.Background())
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "a sweep cut short still releases")
	}
	require.True(t, view.Relays[0].Stopped())
}
