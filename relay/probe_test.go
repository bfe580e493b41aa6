package relay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// probingStore answers the idle probe with a switch and counts probes and fetches.
// Embedding the interface hides the memory store's notifier: only polls drain.
type probingStore struct {
	driver.Store
	pending         atomic.Bool
	probes, fetches atomic.Int64
}

func (s *probingStore) HasPending(ctx context.Context, bucket int) (bool, error) {
	s.probes.Add(1)
	return s.pending.Load(), nil
}

func (s *probingStore) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	s.fetches.Add(1)
	return s.Store.Fetch(ctx, bucket, limit)
}

func (s *probingStore) Driver() driver.Store { return s }

func TestPollAsksTheIdleProbeBeforeFetching(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := &probingStore{Store: newStore(t, 4).Driver()}
	enqueue(t, store, []byte("k"), 3)
	rec := outboxtest.NewRecorder()
	d := newDispatcher(t, store, rec, workerConfig("w"))
	require.NoError(t, d.Start(ctx))
	defer func() { require.NoError(t, d.Stop(ctx)) }()

	waitFor(t, "several polls", func() bool { return store.probes.Load() >= 20 })
	require.Zero(t, store.fetches.Load(), "a bucket the probe calls idle is not fetched")
	require.Zero(t, rec.Len())

	store.pending.Store(true)
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, rec.WaitFor(waitCtx, 3), "once the probe sees pending envelopes, the poll fetches them")
	require.Positive(t, store.fetches.Load())
}
