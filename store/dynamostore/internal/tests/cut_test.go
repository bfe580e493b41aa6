package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// gappedBucket fills the single bucket of s with n messages, each but the last
// followed by an abandoned sequence reservation (numbers reserved for a transaction
// that never commits), and returns them in order.
func gappedBucket(t *testing.T, s *dynamostore.Store, n int) []*driver.Envelope {
	t.Helper()
	ctx := context.Background()
	var envs []*driver.Envelope
	for i := range n {
		env := envelope(t, 1, "t", fmt.Appendf(nil, "k%d", i), fmt.Appendf(nil, "%d", i))
		require.NoError(t, s.Driver().Enqueue(ctx, env))
		envs = append(envs, env)
		if i < n-1 {
			_, err := createItems(t, s, message("t", []byte("abandoned"), []byte("never committed")))
			require.NoError(t, err)
		}
	}
	for i := 1; i < n; i++ {
		require.Equal(t, envs[i-1].Seq+2, envs[i].Seq, "one abandoned reservation between messages")
	}
	return envs
}

// TestCutBatchIsNotTheEndOfTheBucket: a fetch stops before the ninth sequence gap it
// would have to probe and says it cut the batch, and the relay takes that for "more",
// not for a drained bucket: a sweep publishes everything, a stream dispatch reaches
// its target, and a worker drains past any number of gaps in one poll.
func TestCutBatchIsNotTheEndOfTheBucket(t *testing.T) {
	t.Parallel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	t.Run("Fetch", func(t *testing.T) {
		t.Parallel()
		d := newTestDB(t)
		s := d.newStore(t, dynamostore.Config{BucketCount: 1})
		envs := gappedBucket(t, s, 10)
		ctx := context.Background()
		batch, err := s.Driver().Fetch(ctx, 0, 100)
		require.NoError(t, err)
		require.Len(t, batch.Envelopes, 9, "the batch stops before the ninth gap")
		assert.True(t, batch.More, "a batch cut before a gap says the bucket has more")
		require.NoError(t, s.Driver().Complete(ctx, batch.Envelopes))
		batch, err = s.Driver().Fetch(ctx, 0, 100)
		require.NoError(t, err)
		require.Equal(t, []string{"9"}, payloadsOf(batch.Envelopes))
		assert.Equal(t, envs[9].ID, batch.Envelopes[0].ID)
		assert.False(t, batch.More, "the rest of the bucket, whole")
	})

	t.Run("RunOnce", func(t *testing.T) {
		t.Parallel()
		d := newTestDB(t)
		s := d.newStore(t, dynamostore.Config{BucketCount: 1})
		envs := gappedBucket(t, s, 10)
		rec := outboxtest.NewRecorder()
		disp, err := relay.New(s, rec, relay.Config{RelayID: "sweep", Logger: quiet, BacklogInterval: -1})
		require.NoError(t, err)
		res, err := disp.RunOnce(context.Background())
		require.NoError(t, err)
		assert.Equal(t, 10, res.Published, "the sweep drains past the cut")
		assert.Equal(t, payloadsOf(envs), payloadsOf(rec.Messages()))
	})

	t.Run("DispatchAt", func(t *testing.T) {
		t.Parallel()
		d := newTestDB(t)
		s := d.newStore(t, dynamostore.Config{BucketCount: 1})
		envs := gappedBucket(t, s, 10)
		rec := outboxtest.NewRecorder()
		disp, err := relay.New(s, rec, relay.Config{RelayID: "stream", Logger: quiet, BacklogInterval: -1})
		require.NoError(t, err)
		target := envs[9]
		res, err := disp.DispatchAt(context.Background(), 0, target.Seq)
		require.NoError(t, err)
		assert.Equal(t, 10, res.Published)
		assert.Equal(t, 1, rec.Count(target.ID), "the dispatch reaches its target past the cut")
		assert.Equal(t, payloadsOf(envs), payloadsOf(rec.Messages()))
	})

	t.Run("Worker", func(t *testing.T) {
		t.Parallel()
		const n = 81 // ten batches cut at eight gaps each, and one message
		d := newTestDB(t)
		s := d.newStore(t, dynamostore.Config{BucketCount: 1})
		envs := gappedBucket(t, s, n)
		rec := outboxtest.NewRecorder()
		store := &pollCounter{relaySide: side(s)}
		// Rounds are far apart, so drains begin only at polls (the first round, then
		// every PollInterval): the worker must drain past every cut within one.
		disp, err := relay.New(store, rec, relay.Config{
			RelayID: "worker", PollInterval: time.Second, LeaseDuration: 30 * time.Minute, LeaseRenewInterval: 10 * time.Minute,
			Logger: quiet, BacklogInterval: -1,
		})
		require.NoError(t, err)
		require.NoError(t, disp.Start(context.Background()))
		t.Cleanup(func() { _ = disp.Stop(context.Background()) })
		// The old behaviour needs a poll per eight gaps; wait for at most a few polls.
		const polls = 4
		for rec.Len() < n && store.polls[0].Load() < polls {
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("%d of %d published after %d polls", rec.Len(), n, store.polls[0].Load())
		require.Equal(t, n, rec.Len(), "the worker drains past every cut without waiting for a poll")
		assert.Equal(t, payloadsOf(envs), payloadsOf(rec.Messages()))
	})
}
