package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// cuttingStore is the memory store with batches cut the way a store that stops short
// of the limit cuts them (driver.Batch.More on a short batch): at most max envelopes,
// and, with emptyFirst, every other fetch cut before its first envelope.
type cuttingStore struct {
	memDriver
	max        int
	emptyFirst bool
	// emptyAlways: every fetch is cut before its first envelope (a store that
	// breaks the contract: the relay must not spin on it).
	emptyAlways bool
	fetches     atomic.Int64
}

func (s *cuttingStore) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	n := s.fetches.Add(1)
	if s.emptyAlways || (s.emptyFirst && n%2 == 1) {
		return driver.Batch{More: true}, nil
	}
	b, err := s.memDriver.Fetch(ctx, bucket, limit)
	if len(b.Envelopes) > s.max {
		b.Envelopes, b.More = b.Envelopes[:s.max], true
	}
	return b, err
}

func (s *cuttingStore) Driver() driver.Store { return s }

func TestCutBatchMeansMore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg := func(id string) Config {
		c := testConfig(newClock(), id)
		c.BatchSize = 10
		return c
	}

	t.Run("RunOnce", func(t *testing.T) {
		t.Parallel()
		store := &cuttingStore{memDriver: relaySide(newStore(t, 1)), max: 3, emptyFirst: true}
		envs := enqueue(t, store, nil, 25)
		rec := outboxtest.NewRecorder()
		res, err := newDispatcher(t, store, rec, cfg("sweep")).RunOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 25, res.Published, "a sweep drains past every cut batch, empty ones too")
		assert.Equal(t, idsOf(envs), idsOf(rec.Messages()))
	})

	t.Run("DispatchAt", func(t *testing.T) {
		t.Parallel()
		store := &cuttingStore{memDriver: relaySide(newStore(t, 1)), max: 3, emptyFirst: true}
		envs := enqueue(t, store, nil, 25)
		rec := outboxtest.NewRecorder()
		res, err := newDispatcher(t, store, rec, cfg("stream")).DispatchAt(ctx, 0, envs[19].Seq)
		require.NoError(t, err)
		assert.Equal(t, 20, res.Published, "the dispatch goes on past cut batches up to its target, and no further")
		assert.Equal(t, idsOf(envs[:20]), idsOf(rec.Messages()))
	})

	t.Run("HeldBack", func(t *testing.T) {
		t.Parallel()
		// A cut batch whose every envelope waits behind its key's backed-off head
		// comes back the same: the sweep stops instead of fetching it again.
		store := &cuttingStore{memDriver: relaySide(newStore(t, 1)), max: 3}
		envs := enqueue(t, store, []byte("k"), 25)
		rec := outboxtest.NewRecorder()
		rec.FailID(envs[0].ID, errors.New("broker refused"), 1)
		res, err := newDispatcher(t, store, rec, cfg("held")).RunOnce(ctx)
		require.NoError(t, err)
		assert.Equal(t, 1, res.Retried)
		assert.Zero(t, res.Published)
		assert.LessOrEqual(t, store.fetches.Load(), int64(2), "one fetch that failed the head, at most one that found it held back")
	})

	t.Run("EmptyCutsForever", func(t *testing.T) {
		t.Parallel()
		store := &cuttingStore{memDriver: relaySide(newStore(t, 1)), max: 3, emptyAlways: true}
		enqueue(t, store, nil, 5)
		res, err := newDispatcher(t, store, outboxtest.NewRecorder(), cfg("spin")).RunOnce(ctx)
		require.NoError(t, err)
		assert.Zero(t, res.Published)
		assert.Equal(t, int64(emptyCutRefetches+1), store.fetches.Load(), "empty cut batches are fetched again a bounded number of times")
	})
}
