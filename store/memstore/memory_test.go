package memstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

func newStore(t testing.TB, buckets int) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{BucketCount: buckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func newEnvelope(t testing.TB, s *memstore.Store, key, payload string) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: []byte(key), Payload: []byte(payload)}, drv(s).BucketCount())
	require.NoError(t, err)
	return env
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := memstore.New(memstore.Config{BucketCount: -1})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "BucketCount")
	_, err = memstore.New(memstore.Config{MaxMessageSize: -1})
	require.ErrorContains(t, err, "MaxMessageSize")

	s, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	require.Equal(t, driver.DefaultBucketCount, drv(s).BucketCount())
	require.Equal(t, memstore.DefaultMaxMessageSize, s.MaxMessageSize())
}

func sender(t testing.TB, s outbox.Store) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(s, outbox.SenderConfig{})
	require.NoError(t, err)
	return c
}

func TestOnCommitFailureWritesNothing(t *testing.T) {
	t.Parallel()
	s := newStore(t, 1)
	send := sender(t, s)
	boom := errors.New("boom")
	err := s.Transact(context.Background(), func(ctx context.Context) error {
		require.NoError(t, send.Send(ctx, outbox.Message{Topic: "t", Payload: []byte("a")}))
		return memstore.OnCommit(ctx, func() error { return boom })
	})
	require.ErrorIs(t, err, boom)
	envs, err := envelopesOf(drv(s).Fetch(context.Background(), 0, 10))
	require.NoError(t, err)
	require.Empty(t, envs)
}

func TestOnCommitRunsOnlyWhenTheMessagesAreWritten(t *testing.T) {
	t.Parallel()
	s := newStore(t, 2)
	send := sender(t, s)
	taken := outbox.Message{ID: uuid.New(), Topic: "t"}
	require.NoError(t, s.Enqueue(context.Background(), taken))
	applied := false
	err := s.Transact(context.Background(), func(ctx context.Context) error {
		require.NoError(t, memstore.OnCommit(ctx, func() error { applied = true; return nil }))
		return send.Send(ctx, taken) // its ID is held: the commit refuses it
	})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.False(t, applied, "the state change must not happen when the messages cannot be written")

	rolledBack := false
	_ = s.Transact(context.Background(), func(ctx context.Context) error {
		require.NoError(t, memstore.OnCommit(ctx, func() error { rolledBack = true; return nil }))
		return errors.New("handler failed")
	})
	require.False(t, rolledBack, "a rolled-back unit of work runs no state change")

	require.NoError(t, s.Transact(context.Background(), func(ctx context.Context) error {
		return memstore.OnCommit(ctx, func() error { applied = true; return nil })
	}))
	require.True(t, applied)
}

// A nested unit of work that fails drops the state changes it registered; the outer
// unit's commit.
func TestOnCommitInANestedUnitOfWork(t *testing.T) {
	t.Parallel()
	s := newStore(t, 1)
	var applied []string
	require.NoError(t, s.Transact(context.Background(), func(ctx context.Context) error {
		require.NoError(t, memstore.OnCommit(ctx, func() error { applied = append(applied, "outer"); return nil }))
		err := s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, memstore.OnCommit(ctx, func() error { applied = append(applied, "failed"); return nil }))
			return errors.New("nested failed")
		})
		require.Error(t, err)
		return s.Transact(ctx, func(ctx context.Context) error {
			return memstore.OnCommit(ctx, func() error { applied = append(applied, "nested"); return nil })
		})
	}))
	require.Equal(t, []string{"outer", "nested"}, applied)
}

func TestOnCommitOutsideAUnitOfWork(t *testing.T) {
	t.Parallel()
	err := memstore.OnCommit(context.Background(), func() error { return nil })
	require.ErrorIs(t, err, outbox.ErrNoTransaction)
}

func TestTooLarge(t *testing.T) {
	t.Parallel()
	s, err := memstore.New(memstore.Config{BucketCount: 1, MaxMessageSize: 10})
	require.NoError(t, err)
	defer s.Close()
	ctx := context.Background()
	err = drv(s).Enqueue(ctx, newEnvelope(t, s, "k", "ok"), newEnvelope(t, s, "k", "this payload is too long"))
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	envs, err := envelopesOf(drv(s).Fetch(ctx, 0, 10))
	require.NoError(t, err)
	require.Empty(t, envs, "a refused batch writes nothing")
}

func TestDuplicateIDRefused(t *testing.T) {
	t.Parallel()
	s := newStore(t, 1)
	ctx := context.Background()
	env := newEnvelope(t, s, "k", "a")
	require.NoError(t, drv(s).Enqueue(ctx, env))
	require.ErrorIs(t, drv(s).Enqueue(ctx, env.Clone()), outbox.ErrInvalidMessage)
	require.ErrorIs(t, drv(s).Enqueue(ctx, newEnvelope(t, s, "k", "b"), env), outbox.ErrInvalidMessage)
}

func TestCallersCannotChangeStoredEnvelopes(t *testing.T) {
	t.Parallel()
	s := newStore(t, 1)
	ctx := context.Background()
	env := newEnvelope(t, s, "k", "abc")
	require.NoError(t, drv(s).Enqueue(ctx, env))
	env.Payload[0] = 'X'

	got, err := envelopesOf(drv(s).Fetch(ctx, 0, 1))
	require.NoError(t, err)
	require.Equal(t, "abc", string(got[0].Payload))
	got[0].Payload[0] = 'Y'
	got[0].Status = driver.Parked

	again, err := envelopesOf(drv(s).Fetch(ctx, 0, 1))
	require.NoError(t, err)
	require.Len(t, again, 1)
	require.Equal(t, "abc", string(again[0].Payload))
}

// TestQueueBookkeeping drives parking, requeueing, completing and retention through
// enough envelopes to trigger the queue's compaction, and checks Fetch and Stats stay
// exact.
func TestQueueBookkeeping(t *testing.T) {
	t.Parallel()
	s := newStore(t, 1)
	ctx := context.Background()
	var envs []*driver.Envelope
	for range 300 {
		envs = append(envs, newEnvelope(t, s, "k", "p"))
	}
	require.NoError(t, drv(s).Enqueue(ctx, envs...))

	// Park every third, mark every third (offset 1) dispatched: 200 dead in the queue.
	var parked, dispatched []*driver.Envelope
	for i, env := range envs {
		switch i % 3 {
		case 0:
			require.NoError(t, drv(s).Park(ctx, env, "bad"))
			parked = append(parked, env)
		case 1:
			dispatched = append(dispatched, env)
		}
	}
	require.NoError(t, drv(s).MarkDispatched(ctx, dispatched, envs[0].CreatedAt))
	got, err := envelopesOf(drv(s).Fetch(ctx, 0, 1000))
	require.NoError(t, err)
	require.Len(t, got, 100)
	for i, env := range got {
		require.Equal(t, envs[3*i+2].ID, env.ID)
	}

	// Requeue the parked ones: they return to their Seq positions.
	ids := make([]uuid.UUID, 0, len(parked))
	for _, env := range parked {
		ids = append(ids, env.ID)
	}
	n, err := drv(s).Requeue(ctx, ids...)
	require.NoError(t, err)
	require.Equal(t, 100, n)
	got, err = envelopesOf(drv(s).Fetch(ctx, 0, 1000))
	require.NoError(t, err)
	require.Len(t, got, 200)
	for i := 1; i < len(got); i++ {
		require.Less(t, got[i-1].Seq, got[i].Seq)
	}
	st, err := drv(s).Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{200}, st.Pending)
	require.Zero(t, st.Parked)

	require.NoError(t, drv(s).Complete(ctx, got))
	got, err = envelopesOf(drv(s).Fetch(ctx, 0, 1000))
	require.NoError(t, err)
	require.Empty(t, got)
	deleted, err := drv(s).DeleteDispatched(ctx, envs[0].CreatedAt.Add(1), 1000)
	require.NoError(t, err)
	require.Equal(t, 100, deleted)
}

func TestConcurrentEnqueueKeepsSeqStrictlyIncreasing(t *testing.T) {
	t.Parallel()
	s := newStore(t, 2)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 50 {
				if err := drv(s).Enqueue(ctx, newEnvelope(t, s, string(rune('a'+g)), "p")); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for b := range 2 {
		envs, err := envelopesOf(drv(s).Fetch(ctx, b, 1000))
		require.NoError(t, err)
		for i := 1; i < len(envs); i++ {
			require.Less(t, envs[i-1].Seq, envs[i].Seq)
		}
		total += len(envs)
	}
	require.Equal(t, 400, total)
}

// benchEnvelopes returns n envelopes spread over the store's buckets; renumber gives
// them fresh IDs cheaply, so benchmarks measure the store and not ID generation.
func benchEnvelopes(b *testing.B, s *memstore.Store, n int, bucket int) (envs []*driver.Envelope, renumber func()) {
	b.Helper()
	payload := make([]byte, 256)
	envs = make([]*driver.Envelope, n)
	for i := range envs {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "bench", Key: []byte{byte(i)}, Payload: payload}, drv(s).BucketCount())
		if err != nil {
			b.Fatal(err)
		}
		if bucket >= 0 {
			env.Bucket = bucket
		}
		envs[i] = env
	}
	var counter uint64
	return envs, func() {
		for _, env := range envs {
			counter++
			binary.BigEndian.PutUint64(env.ID[8:], counter)
		}
	}
}

func BenchmarkEnqueue(b *testing.B) {
	for _, batch := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			s := newStore(b, driver.DefaultBucketCount)
			ctx := context.Background()
			envs, renumber := benchEnvelopes(b, s, batch, -1)
			b.ReportAllocs()
			for b.Loop() {
				renumber()
				if err := drv(s).Enqueue(ctx, envs...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

// BenchmarkFetchComplete keeps one bucket's backlog at a steady size and measures a
// relay's store work per batch: fetch the head, complete it (while writers append as
// many). The figure should not fall as the backlog grows.
func BenchmarkFetchComplete(b *testing.B) {
	const batch = 100
	for _, backlog := range []int{1_000, 100_000} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			s := newStore(b, 1)
			ctx := context.Background()
			envs, renumber := benchEnvelopes(b, s, batch, 0)
			for range backlog / batch {
				renumber()
				if err := drv(s).Enqueue(ctx, envs...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				renumber()
				if err := drv(s).Enqueue(ctx, envs...); err != nil {
					b.Fatal(err)
				}
				head, err := envelopesOf(drv(s).Fetch(ctx, 0, batch))
				if err != nil || len(head) != batch {
					b.Fatal(err, len(head))
				}
				if err := drv(s).Complete(ctx, head); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}

func TestConformance(t *testing.T) {
	outboxtest.RunStoreTests(t, outboxtest.StoreHarness{
		New: func(t *testing.T, buckets int) outboxtest.Store {
			s, err := memstore.New(memstore.Config{BucketCount: buckets})
			require.NoError(t, err)
			return s
		},
	})
}

// fullStore is the memory store's relay side with every capability it has.
type fullStore interface {
	driver.Store
	driver.Admin
	driver.Notifier
	driver.Finder
	driver.Retainer
}

func drv(s *memstore.Store) fullStore { return s.Driver().(fullStore) }

// envelopesOf takes the envelopes of a fetched batch.
func envelopesOf(b driver.Batch, err error) ([]*driver.Envelope, error) { return b.Envelopes, err }
