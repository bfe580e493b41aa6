package relay

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// countingObserver records what the dispatcher reports.
type countingObserver struct {
	NopObserver
	mu                                 sync.Mutex
	publishCalls, acked, completed     int
	retried, parked, permanent, rounds int
	lags                               []time.Duration
	samples                            []driver.Backlog
	lastOwned                          int
}

func (o *countingObserver) Published(_ context.Context, batch, acked []*driver.Envelope, start time.Time, took time.Duration, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.publishCalls++
	o.acked += len(acked)
	for _, e := range acked {
		o.lags = append(o.lags, start.Add(took).Sub(e.CreatedAt))
	}
}

func (o *countingObserver) Completed(_ context.Context, envs []*driver.Envelope) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.completed += len(envs)
}

func (o *countingObserver) Retried(context.Context, *driver.Envelope, int, string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.retried++
}

func (o *countingObserver) Parked(_ context.Context, _ *driver.Envelope, permanent bool, _ string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.parked++
	if permanent {
		o.permanent++
	}
}

func (o *countingObserver) Round(_ context.Context, owned int, _ bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err == nil {
		o.rounds++
		o.lastOwned = owned
	}
}

func (o *countingObserver) Backlog(_ context.Context, st driver.Backlog, _ time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.samples = append(o.samples, st)
}

func (o *countingObserver) snapshot() countingObserver {
	o.mu.Lock()
	defer o.mu.Unlock()
	return countingObserver{
		publishCalls: o.publishCalls, acked: o.acked, completed: o.completed,
		retried: o.retried, parked: o.parked, permanent: o.permanent, rounds: o.rounds,
		lags: append([]time.Duration(nil), o.lags...), samples: append([]driver.Backlog(nil), o.samples...),
		lastOwned: o.lastOwned,
	}
}

func TestObserverSeesEveryOutcome(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, 4)
	rec := outboxtest.NewRecorder()
	obs := &countingObserver{}
	cfg := workerConfig("obs")
	cfg.Observer = obs
	cfg.MaxAttempts = 2
	d := newDispatcher(t, store, rec, cfg)

	ok := enqueue(t, store, nil, 20)
	failing := enqueue(t, store, []byte("bad"), 1)
	permanent := enqueue(t, store, []byte("worse"), 1)
	rec.FailID(failing[0].ID, errors.New("broker said no"), -1)
	rec.FailID(permanent[0].ID, driver.Permanent(errors.New("too large")), -1)

	require.NoError(t, d.Start(ctx))
	waitFor(t, "everything published or parked", func() bool {
		st := d.Stats()
		return st.Published == int64(len(ok)) && st.Parked == 2
	})
	require.NoError(t, d.Stop(ctx))

	got := obs.snapshot()
	st := d.Stats()
	require.Equal(t, int(st.Published), got.completed, "Completed reports what Stats.Published counts")
	require.Equal(t, len(ok), got.acked, "acknowledged envelopes")
	require.Equal(t, int(st.Retried), got.retried)
	require.Equal(t, 1, got.retried, "the failing message is retried once, then parked at MaxAttempts 2")
	require.Equal(t, 2, got.parked)
	require.Equal(t, 1, got.permanent)
	require.GreaterOrEqual(t, got.publishCalls, 3)
	require.Positive(t, got.rounds)
	require.Equal(t, 4, got.lastOwned, "the only relay owns every bucket")
	require.Len(t, got.lags, len(ok))
	for _, lag := range got.lags {
		require.Positive(t, lag)
		require.Less(t, lag, time.Minute)
	}
}

func TestBacklogSampledByTheOwnerOfBucketZero(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, 4)
	rec := outboxtest.NewRecorder()
	// Hold every publish back, so the backlog stays where it is.
	rec.FailWhen(func(*driver.Envelope) error { return errors.New("broker down") })
	obs := &countingObserver{}
	cfg := workerConfig("sampler")
	cfg.Observer = obs
	cfg.BacklogInterval = time.Millisecond
	cfg.LeaseRenewInterval = 200 * time.Millisecond
	cfg.BackoffBase, cfg.BackoffMax = time.Hour, time.Hour
	cfg.MaxAttempts = 100
	d := newDispatcher(t, store, rec, cfg)
	envs := enqueue(t, store, []byte("k"), 5)
	before := time.Now()

	require.Zero(t, d.Stats().BacklogAt, "no sample before the worker runs")
	require.NoError(t, d.Start(ctx))
	waitFor(t, "a backlog sample", func() bool { return len(obs.snapshot().samples) >= 2 })
	require.NoError(t, d.Stop(ctx))

	st := d.Stats()
	require.False(t, st.BacklogAt.Before(before))
	total := 0
	for _, n := range st.Backlog.Pending {
		total += n
	}
	require.Equal(t, len(envs), total, "the sample counts the pending messages")
	require.Equal(t, envs[0].CreatedAt.UTC(), st.Backlog.OldestPending.UTC())
	last := obs.snapshot().samples
	require.Equal(t, st.Backlog.Pending, last[len(last)-1].Pending, "the observer gets the same figures")
}

func TestBacklogNotSampledWithoutBucketZero(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, 2)
	// A peer holds bucket 0 for the whole test.
	now := time.Now()
	ok, err := store.Driver().Claim(ctx, 0, "peer", now, now.Add(time.Hour))
	require.NoError(t, err)
	require.True(t, ok)
	_, err = store.Driver().Heartbeat(ctx, "peer", now.Add(time.Hour), 2, driver.Instance{})
	require.NoError(t, err)

	obs := &countingObserver{}
	cfg := workerConfig("other")
	cfg.Observer = obs
	cfg.BacklogInterval = time.Millisecond
	cfg.LeaseRenewInterval = 100 * time.Millisecond
	d := newDispatcher(t, store, outboxtest.NewRecorder(), cfg)
	require.NoError(t, d.Start(ctx))
	waitFor(t, "bucket 1", func() bool { return len(d.Owned()) == 1 })
	waitFor(t, "several rounds", func() bool { return obs.snapshot().rounds >= 3 })
	require.NoError(t, d.Stop(ctx))
	require.Empty(t, obs.snapshot().samples, "only the owner of bucket 0 samples")
	require.Zero(t, d.Stats().BacklogAt)
}

func TestReady(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, 4)
	d := newDispatcher(t, store, outboxtest.NewRecorder(), workerConfig("ready"))
	require.False(t, d.Ready(), "not ready before Start")
	require.NoError(t, d.Start(ctx))
	waitFor(t, "ready", d.Ready)
	require.Len(t, d.Owned(), 4)
	require.NoError(t, d.Stop(ctx))
	require.False(t, d.Ready(), "not ready after Stop")
}
