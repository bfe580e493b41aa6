package chaostest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// errStoreDown is what faultyStore returns while it is down.
var errStoreDown = errors.New("store unreachable")

// faultyStore wraps a real store's relay side, counts the calls a relay makes, and
// fails every one of them while it is down. It exposes only driver.Store, so the
// relay polls instead of waiting for wake-ups.
type faultyStore struct {
	driver.Store
	down  atomic.Bool
	calls atomic.Int64
}

// Driver hands the relay the wrapper.
func (f *faultyStore) Driver() driver.Store { return f }

func (f *faultyStore) enter() error {
	f.calls.Add(1)
	if f.down.Load() {
		return errStoreDown
	}
	return nil
}

func (f *faultyStore) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	if err := f.enter(); err != nil {
		return driver.Batch{}, err
	}
	return f.Store.Fetch(ctx, bucket, limit)
}

func (f *faultyStore) Complete(ctx context.Context, envs []*driver.Envelope) error {
	if err := f.enter(); err != nil {
		return err
	}
	return f.Store.Complete(ctx, envs)
}

func (f *faultyStore) Reschedule(ctx context.Context, env *driver.Envelope, next time.Time, cause string) error {
	if err := f.enter(); err != nil {
		return err
	}
	return f.Store.Reschedule(ctx, env, next, cause)
}

func (f *faultyStore) Park(ctx context.Context, env *driver.Envelope, cause string) error {
	if err := f.enter(); err != nil {
		return err
	}
	return f.Store.Park(ctx, env, cause)
}

func (f *faultyStore) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	if err := f.enter(); err != nil {
		return driver.Coordination{}, err
	}
	return f.Store.ReadCoordination(ctx)
}

func (f *faultyStore) ReadRelays(ctx context.Context) ([]driver.RelayRecord, error) {
	if err := f.enter(); err != nil {
		return nil, err
	}
	return f.Store.ReadRelays(ctx)
}

func (f *faultyStore) Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int, instance driver.Instance) (bool, error) {
	if err := f.enter(); err != nil {
		return false, err
	}
	return f.Store.Heartbeat(ctx, relay, at, bucketCount, instance)
}

func (f *faultyStore) Claim(ctx context.Context, bucket int, owner string, now, expiresAt time.Time) (bool, error) {
	if err := f.enter(); err != nil {
		return false, err
	}
	return f.Store.Claim(ctx, bucket, owner, now, expiresAt)
}

func (f *faultyStore) Renew(ctx context.Context, held driver.Lease, now, expiresAt time.Time) (bool, error) {
	if err := f.enter(); err != nil {
		return false, err
	}
	return f.Store.Renew(ctx, held, now, expiresAt)
}

func (f *faultyStore) Release(ctx context.Context, held driver.Lease) (bool, error) {
	if err := f.enter(); err != nil {
		return false, err
	}
	return f.Store.Release(ctx, held)
}

func (f *faultyStore) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if err := f.enter(); err != nil {
		return err
	}
	return f.Store.StopRelay(ctx, relay, at)
}

func (f *faultyStore) DeleteRelay(ctx context.Context, relay string, lastSeen time.Time) (bool, error) {
	if err := f.enter(); err != nil {
		return false, err
	}
	return f.Store.DeleteRelay(ctx, relay, lastSeen)
}

func enqueueN(t testing.TB, s outbox.Store, n, from int) {
	t.Helper()
	msgs := make([]outbox.Message, 0, 1000)
	flush := func() {
		require.NoError(t, s.Enqueue(context.Background(), msgs...))
		msgs = msgs[:0]
	}
	for i := range n {
		msgs = append(msgs, outbox.Message{
			Topic:   "t",
			Key:     fmt.Appendf(nil, "k%d", (from+i)%97),
			Payload: fmt.Appendf(nil, "payload-%08d", from+i),
		})
		if len(msgs) == cap(msgs) {
			flush()
		}
	}
	if len(msgs) > 0 {
		flush()
	}
}

// TestStoreOutageBacksOffAndRecovers takes the store away from a running worker: the
// worker must back off (a bounded number of store calls, not a tight loop) and pick
// up the backlog by itself once the store is back.
func TestStoreOutageBacksOffAndRecovers(t *testing.T) {
	inner, err := memstore.New(memstore.Config{BucketCount: 4})
	require.NoError(t, err)
	store := &faultyStore{Store: inner.Driver()}
	rec := outboxtest.NewRecorder()
	const renew = 200 * time.Millisecond
	d, err := relay.New(store, rec, relay.Config{
		PollInterval:  5 * time.Millisecond,
		LeaseDuration: 3 * renew, LeaseRenewInterval: renew,
		Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, d.Start(ctx))
	t.Cleanup(func() { _ = d.Stop(context.Background()) })

	enqueueN(t, inner, 100, 0)
	wait, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, rec.WaitFor(wait, 100))

	// The store goes away for two seconds, while new messages wait in it.
	store.down.Store(true)
	before := store.calls.Load()
	enqueueN(t, inner, 100, 100)
	const outage = 2 * time.Second
	time.Sleep(outage)
	during := store.calls.Load() - before
	t.Logf("%d store calls during a %s outage", during, outage)
	require.Positive(t, during, "the worker must keep trying")
	// Backing off from 50 ms to the renew interval makes about outage/renew attempts
	// of a few calls each; a tight loop with a 5 ms poll would make hundreds.
	require.Less(t, during, int64(4*outage/renew), "the worker must back off during a store outage")
	require.Equal(t, 100, rec.Len(), "nothing can be published while the store is down")

	store.down.Store(false)
	wait2, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	// Batches whose completion the outage cut off are published again (at least once).
	require.NoError(t, rec.WaitForUnique(wait2, 200), "the worker must recover on its own")
	require.NoError(t, d.Err())
}

// BenchmarkDrainBacklog100k drains a backlog of 100,000 messages (and, to show that
// the relay's share does not grow with the backlog, 10,000) from the memory store into
// a count-only Recorder with one RunOnce, and reports:
//
//   - live-MB-over-backlog: the highest live heap (as marked by each garbage
//     collection during the drain, sampled every millisecond) minus the live heap
//     that held the backlog before it: what the relay added. The gogc=5 runs collect
//     often enough for this to mean something; with the default GOGC a drain may see
//     no collection at all;
//   - peak-heap-over-backlog-MB: the same with every heap object, garbage included;
//   - alloc-B/msg: bytes allocated per message drained;
//   - msg/s.
func BenchmarkDrainBacklog100k(b *testing.B) {
	for _, gogc := range []int{100, 5} {
		for _, n := range []int{100_000, 10_000} {
			for _, batch := range []int{100, 500} {
				b.Run(fmt.Sprintf("gogc=%d/backlog=%d/batch=%d", gogc, n, batch), func(b *testing.B) {
					drainBacklog(b, gogc, n, batch)
				})
			}
		}
	}
}

func drainBacklog(b *testing.B, gogc, n, batch int) {
	var liveOver, peakOver, allocPerMsg, msgsPerSec float64
	for range b.N {
		b.StopTimer()
		store, err := memstore.New(memstore.Config{BucketCount: 8})
		require.NoError(b, err)
		enqueueN(b, store, n, 0)
		rec := &outboxtest.Recorder{CountOnly: true}
		d, err := relay.New(store, rec, relay.Config{BatchSize: batch, RelayID: "bench", Logger: slog.New(slog.DiscardHandler)})
		require.NoError(b, err)
		runtime.GC()
		baseLive, baseHeap := heapBytes()
		var ms0 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		peak := sampleHeap()
		old := debug.SetGCPercent(gogc)
		start := time.Now()
		b.StartTimer()

		res, err := d.RunOnce(context.Background())

		b.StopTimer()
		debug.SetGCPercent(old)
		elapsed := time.Since(start)
		topLive, topHeap := peak()
		var ms1 runtime.MemStats
		runtime.ReadMemStats(&ms1)
		require.NoError(b, err)
		require.Equal(b, n, res.Published)
		require.Equal(b, n, rec.Unique())
		liveOver += (float64(topLive) - float64(baseLive)) / (1 << 20)
		peakOver += (float64(topHeap) - float64(baseHeap)) / (1 << 20)
		allocPerMsg += float64(ms1.TotalAlloc-ms0.TotalAlloc) / float64(n)
		msgsPerSec += float64(n) / elapsed.Seconds()
		_ = store.Close()
		b.StartTimer()
	}
	b.ReportMetric(liveOver/float64(b.N), "live-MB-over-backlog")
	b.ReportMetric(peakOver/float64(b.N), "peak-heap-over-backlog-MB")
	b.ReportMetric(allocPerMsg/float64(b.N), "alloc-B/msg")
	b.ReportMetric(msgsPerSec/float64(b.N), "msg/s")
}

// heapBytes returns the live heap as of the last garbage collection, and every heap
// object's bytes, garbage included.
func heapBytes() (live, all uint64) {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// sampleHeap samples the heap every millisecond until the returned function is
// called, which returns the highest samples.
func sampleHeap() func() (live, all uint64) {
	var (
		mu        sync.Mutex
		live, all = heapBytes()
		done      = make(chan struct{})
		wg        sync.WaitGroup
	)
	record := func() {
		l, a := heapBytes()
		mu.Lock()
		live, all = max(live, l), max(all, a)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				record()
			}
		}
	}()
	return func() (uint64, uint64) {
		close(done)
		wg.Wait()
		record()
		mu.Lock()
		defer mu.Unlock()
		return live, all
	}
}
