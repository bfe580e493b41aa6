package relay

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// workerConfig runs on the real clock with short timings.
func workerConfig(id string) Config {
	return Config{
		RelayID:            id,
		PollInterval:       20 * time.Millisecond,
		LeaseDuration:      3 * time.Second,
		LeaseRenewInterval: time.Second,
		BackoffBase:        10 * time.Millisecond,
		BackoffMax:         50 * time.Millisecond,
		Logger:             quietLogger(),
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestWorkerStartStop(t *testing.T) {
	ctx := context.Background()
	baseline := runtime.NumGoroutine()
	store := newStore(t, 8)
	rec := outboxtest.NewRecorder()
	d := newDispatcher(t, store, rec, workerConfig("w"))

	require.NoError(t, d.Start(ctx))
	waitFor(t, "all buckets", func() bool { return len(d.Owned()) == 8 })
	enqueue(t, store, []byte("k"), 50)
	enqueue(t, store, nil, 50)
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, rec.WaitFor(waitCtx, 100))

	require.NoError(t, d.Stop(ctx))
	select {
	case <-d.Stopped():
	default:
		t.Fatal("Stopped is not closed after Stop")
	}
	require.NoError(t, d.Stop(ctx), "stopping twice is a no-op")
	require.NoError(t, d.Err())
	require.ErrorIs(t, d.Start(ctx), outbox.ErrClosed, "a dispatcher starts once")

	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "Stop releases every lease")
	}
	require.True(t, view.Relays[0].Stopped())
	require.Zero(t, pending(t, store))
	requireKeyOrder(t, rec)
	require.Zero(t, rec.Duplicates())

	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= baseline })
}

func TestWorkerWakesUpOnCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 8)
	rec := outboxtest.NewRecorder()
	cfg := workerConfig("w")
	// Neither a poll nor a coordination round comes within the test: only a wake-up
	// can deliver in time.
	cfg.PollInterval = time.Hour
	cfg.LeaseRenewInterval = time.Minute
	cfg.LeaseDuration = 3 * time.Minute
	d := newDispatcher(t, store, rec, cfg)
	require.NoError(t, d.Start(ctx))
	defer func() { require.NoError(t, d.Stop(ctx)) }()
	waitFor(t, "all buckets", func() bool { return len(d.Owned()) == 8 })
	// The first drain pass ran with the round; from now on only wake-ups drain.
	time.Sleep(50 * time.Millisecond)

	for i := range 5 {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: []byte{byte(i)}, Payload: []byte("x")}, store.Driver().BucketCount())
		require.NoError(t, err)
		require.NoError(t, store.Driver().Enqueue(ctx, env))
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		require.NoError(t, rec.WaitFor(waitCtx, i+1), "commit %d not delivered without a poll", i)
		cancel()
	}
}

// mismatchedStore stamps another bucket count on what it fetches, as if a writer
// used another count.
type mismatchedStore struct{ memDriver }

func (s mismatchedStore) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	batch, err := s.memDriver.Fetch(ctx, bucket, limit)
	for _, e := range batch.Envelopes {
		e.BucketCount = 16
	}
	return batch, err
}

func (s mismatchedStore) Driver() driver.Store { return s }

func TestMisconfiguredEnvelopeStopsTheWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 8)
	rec := outboxtest.NewRecorder()
	d := newDispatcher(t, mismatchedStore{relaySide(store)}, rec, workerConfig("w"))
	enqueue(t, store, []byte("k"), 1)
	require.NoError(t, d.Start(ctx))
	select {
	case <-d.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not stop on a bucket count mismatch")
	}
	require.ErrorIs(t, d.Err(), outbox.ErrMisconfigured)
	require.ErrorContains(t, d.Err(), "bucket count 16")
	require.Zero(t, rec.Len())
	require.NoError(t, d.Stop(ctx))
	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "a worker that stops on its own releases its leases")
	}
}

// flakyStore fails every call while down is set, counting the calls.
type flakyStore struct {
	memDriver
	down  atomic.Bool
	calls atomic.Int64
}

var errStoreDown = errors.New("store down")

func (s *flakyStore) fail() error {
	if s.down.Load() {
		s.calls.Add(1)
		return errStoreDown
	}
	return nil
}

func (s *flakyStore) Driver() driver.Store { return s }

func (s *flakyStore) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	if err := s.fail(); err != nil {
		return driver.Batch{}, err
	}
	batch, err := s.memDriver.Fetch(ctx, bucket, limit)
	// A fetch that began before the store went down fails too if it ends after: it
	// may have read what was written since.
	if ferr := s.fail(); ferr != nil {
		return driver.Batch{}, ferr
	}
	return batch, err
}

func (s *flakyStore) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if err := s.fail(); err != nil {
		return err
	}
	return s.memDriver.StopRelay(ctx, relay, at)
}

func (s *flakyStore) Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int, instance driver.Instance) (bool, error) {
	if err := s.fail(); err != nil {
		return false, err
	}
	return s.memDriver.Heartbeat(ctx, relay, at, bucketCount, instance)
}

func TestWorkerBacksOffOnStoreErrorsAndRecovers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 2)
	flaky := &flakyStore{memDriver: relaySide(store)}
	rec := outboxtest.NewRecorder()
	cfg := workerConfig("w")
	cfg.PollInterval = time.Millisecond
	d := newDispatcher(t, flaky, rec, cfg)
	require.NoError(t, d.Start(ctx))
	defer func() { require.NoError(t, d.Stop(ctx)) }()
	waitFor(t, "buckets", func() bool { return len(d.Owned()) == 2 })

	flaky.down.Store(true)
	enqueue(t, store, nil, 10)
	time.Sleep(500 * time.Millisecond)
	// With a 1 ms poll, a tight loop would make hundreds of calls; backoff doubling
	// from 50 ms makes a handful.
	require.Less(t, flaky.calls.Load(), int64(30), "the worker backs off on store errors")
	require.Zero(t, rec.Len())

	flaky.down.Store(false)
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, rec.WaitFor(waitCtx, 10), "the worker recovers by itself")
}

// stuckTransport blocks every publish until its context ends.
type stuckTransport struct{ entered chan struct{} }

func (s stuckTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func TestCancellingStartContextStopsTheWorker(t *testing.T) {
	t.Parallel()
	store := newStore(t, 4)
	d := newDispatcher(t, store, outboxtest.NewRecorder(), workerConfig("w"))
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, d.Start(ctx))
	waitFor(t, "buckets", func() bool { return len(d.Owned()) == 4 })
	cancel()
	select {
	case <-d.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("cancelling Start's context did not stop the worker")
	}
	require.NoError(t, d.Err())
	view, err := store.Driver().ReadCoordination(context.Background())
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner)
	}
}

func TestRunOnceRefusedWhileTheWorkerRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 4)
	d := newDispatcher(t, store, outboxtest.NewRecorder(), workerConfig("w"))
	require.NoError(t, d.Start(ctx))
	_, err := d.RunOnce(ctx)
	require.ErrorIs(t, err, ErrRunning)
	require.ErrorIs(t, d.Start(ctx), ErrRunning, "Start while the worker runs")
	require.NoError(t, d.Stop(ctx))
	require.ErrorIs(t, d.Start(ctx), outbox.ErrClosed, "Start after Stop")
}

func TestTwoWorkersShareBucketsAndKeepOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 8)
	rec := outboxtest.NewRecorder()
	a := newDispatcher(t, store, rec, workerConfig("a"))
	b := newDispatcher(t, store, rec, workerConfig("b"))
	require.NoError(t, a.Start(ctx))
	require.NoError(t, b.Start(ctx))

	// Sample both relays at one instant, continuously, until the test ends.
	done := make(chan struct{})
	sampled := make(chan int)
	go func() {
		n := 0
		defer func() { sampled <- n }()
		for {
			select {
			case <-done:
				return
			default:
			}
			now := time.Now().UTC()
			mine := map[int]bool{}
			for _, bk := range a.leases.owned(now) {
				mine[bk] = true
			}
			for _, bk := range b.leases.owned(now) {
				if mine[bk] {
					t.Errorf("bucket %d publishable by both relays at %s", bk, now)
				}
			}
			n++
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() {
		close(done)
		require.Positive(t, <-sampled)
	}()

	for i := range 20 {
		enqueue(t, store, []byte{byte(i % 5)}, 10)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	require.NoError(t, rec.WaitFor(waitCtx, 200))
	waitFor(t, "a fair split", func() bool { return len(a.Owned()) == 4 && len(b.Owned()) == 4 })
	requireKeyOrder(t, rec)
	require.NoError(t, a.Stop(ctx))
	waitFor(t, "b to take over", func() bool { return len(b.Owned()) == 8 })

	// Stream-triggered dispatch in the process that runs the worker drains under the
	// worker's lease.
	env := enqueue(t, store, []byte("late"), 1)[0]
	res, err := b.DispatchOne(ctx, env.ID)
	require.NoError(t, err)
	require.LessOrEqual(t, res.Published, 1, "the worker may have got there first")
	require.Equal(t, 1, rec.Count(env.ID))
	require.NoError(t, b.Stop(ctx))
	// Starting together on free buckets, plans can overlap once: a few refusals at most.
	require.LessOrEqual(t, a.Stats().RefusedWrites+b.Stats().RefusedWrites, int64(8))
}

func TestClosedStoreStopsTheWorker(t *testing.T) {
	t.Parallel()
	store := newStore(t, 2)
	d := newDispatcher(t, store, outboxtest.NewRecorder(), workerConfig("w"))
	require.NoError(t, d.Start(context.Background()))
	waitFor(t, "buckets", func() bool { return len(d.Owned()) == 2 })
	require.NoError(t, store.Close())
	select {
	case <-d.Stopped():
	case <-time.After(10 * time.Second):
		t.Fatal("the worker did not stop on a closed store")
	}
	require.ErrorIs(t, d.Err(), outbox.ErrClosed)
	require.NoError(t, d.Stop(context.Background()), "Stop after the worker stopped on its own is a no-op")
}

// A fleet of workers with faults and a rolling restart loses nothing and keeps every
// key's first deliveries in commit order.
func TestFleetUnderFaultsKeepsOrderAndLosesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 8)
	rec := outboxtest.NewRecorder()
	ft, err := outboxtest.NewFaultTransport(rec, outboxtest.Faults{
		MessageErrorRate: 0.2,
		BatchErrorRate:   0.05,
		Latency:          100 * time.Microsecond,
		Jitter:           time.Millisecond,
		Seed:             42,
	})
	require.NoError(t, err)
	cfg := func(id string) Config {
		c := workerConfig(id)
		c.MaxAttempts = 1000
		c.BatchSize = 16
		return c
	}
	workers := []*Relay{
		newDispatcher(t, store, ft, cfg("w1")),
		newDispatcher(t, store, ft, cfg("w2")),
		newDispatcher(t, store, ft, cfg("w3")),
	}
	for _, w := range workers {
		require.NoError(t, w.Start(ctx))
	}
	total := 0
	for round := range 10 {
		for k := range 20 {
			enqueue(t, store, []byte{byte(k)}, 3)
			total += 3
		}
		enqueue(t, store, nil, 10)
		total += 10
		if round == 4 {
			// Rolling restart of one relay.
			require.NoError(t, workers[0].Stop(ctx))
			workers[0] = newDispatcher(t, store, ft, cfg("w1-restarted"))
			require.NoError(t, workers[0].Start(ctx))
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitFor(t, "every message", func() bool { return rec.Unique() == total })
	for _, w := range workers {
		require.NoError(t, w.Stop(ctx))
	}
	require.Positive(t, ft.Injected(), "faults were injected")
	requireKeyOrder(t, rec)
	require.Zero(t, pending(t, store))
}

// Commits keep announcing wake-ups while the store fails: the error backoff must not
// be cut short by them.
func TestWakeUpsDoNotCutTheErrorBackoffShort(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 2)
	flaky := &flakyStore{memDriver: relaySide(store)}
	rec := outboxtest.NewRecorder()
	d := newDispatcher(t, flaky, rec, workerConfig("w"))
	require.NoError(t, d.Start(ctx))
	defer func() { require.NoError(t, d.Stop(ctx)) }()
	waitFor(t, "buckets", func() bool { return len(d.Owned()) == 2 })

	flaky.down.Store(true)
	for range 250 { // ~500 ms of commits, each announced to the worker
		enqueue(t, store, nil, 1)
		time.Sleep(2 * time.Millisecond)
	}
	require.Less(t, flaky.calls.Load(), int64(30), "wake-ups cut the backoff short")

	flaky.down.Store(false)
	waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, rec.WaitFor(waitCtx, 250), "the worker recovers by itself")
}

// A publish still in flight when its bucket's lease lapses is abandoned: a peer may
// own the bucket by then. Nothing is assumed sent, but it counts as an attempt, so a
// message that can never be published within a lease parks instead of holding its
// bucket for good.
func TestPublishIsAbandonedWhenTheLeaseRunsOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 1)
	cfg := workerConfig("r")
	cfg.LeaseDuration = 600 * time.Millisecond
	cfg.LeaseRenewInterval = 200 * time.Millisecond
	cfg.MaxAttempts = 2
	d := newDispatcher(t, store, stuckTransport{entered: make(chan struct{}, 2)}, cfg)
	envs := enqueue(t, store, []byte("k"), 1)

	res, err := d.RunOnce(ctx) // would block for good if the publish were not cut
	require.NoError(t, err)
	require.Zero(t, res.Published)
	require.Equal(t, 1, res.Retried, "the abandoned publish is an attempt")
	env, err := find(ctx, store, envs[0].ID)
	require.NoError(t, err)
	require.Equal(t, driver.Pending, env.Status)
	require.Equal(t, 1, env.Attempts)
	require.Contains(t, env.LastError, "outlasted the bucket's lease")

	// Once due again, the second abandoned publish is the last attempt: it parks.
	for !env.Due(time.Now()) {
		time.Sleep(5 * time.Millisecond)
	}
	res, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Parked)
	env, err = find(ctx, store, envs[0].ID)
	require.NoError(t, err)
	require.Equal(t, driver.Parked, env.Status)
}
