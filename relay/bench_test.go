package relay

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// BenchmarkDrain measures how fast one relay drains a backlog of b.N messages with
// distinct keys from the memory store into the recording transport, per batch size
// and number of buckets drained in parallel (4 is the default; the memory store and
// the recorder each serialise on one lock, so parallel drains only pay off against
// stores and brokers with real latency).
func BenchmarkDrain(b *testing.B) {
	for _, conc := range []int{1, DefaultMaxConcurrency} {
		for _, batch := range []int{1, 100, 500} {
			b.Run(fmt.Sprintf("batch=%d/concurrency=%d", batch, conc), func(b *testing.B) {
				benchDrain(b, Config{BatchSize: batch, MaxConcurrency: conc}, 0, false)
			})
		}
	}
}

// BenchmarkDrainHotKey drains a backlog spread over only 8 keys (one per bucket), the
// case where one envelope per key per Publish call costs a round trip per envelope,
// and a transport that keeps key order wins it back.
func BenchmarkDrainHotKey(b *testing.B) {
	for _, same := range []bool{false, true} {
		b.Run(fmt.Sprintf("batch=100/KeepsKeyOrder=%t", same), func(b *testing.B) {
			benchDrain(b, Config{BatchSize: 100}, 8, same)
		})
	}
}

// benchDrain enqueues b.N messages (keys distinct when keys is 0, else keys of them)
// and times one RunOnce that drains them all into a Recorder (one that claims to keep
// key order when keepsKeyOrder is set).
func benchDrain(b *testing.B, cfg Config, keys int, keepsKeyOrder bool) {
	ctx := context.Background()
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	envs := make([]*driver.Envelope, 0, 1000)
	for i := range b.N {
		k := i
		if keys > 0 {
			k = i % keys
		}
		env, err := driver.NewEnvelope(outbox.Message{
			Topic:   "bench",
			Key:     fmt.Appendf(nil, "key-%d", k),
			Payload: make([]byte, 256),
		}, store.Driver().BucketCount())
		if err != nil {
			b.Fatal(err)
		}
		envs = append(envs, env)
		if len(envs) == cap(envs) || i == b.N-1 {
			if err := store.Driver().Enqueue(ctx, envs...); err != nil {
				b.Fatal(err)
			}
			envs = envs[:0]
		}
	}
	cfg.RelayID = "bench"
	cfg.Logger = quietLogger()
	var tr driver.Transport = outboxtest.NewRecorder()
	if keepsKeyOrder {
		tr = keyOrdered{tr}
	}
	d, err := New(store, tr, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	res, err := d.RunOnce(ctx)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if res.Published != b.N {
		b.Fatalf("published %d of %d", res.Published, b.N)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// keyOrdered declares that its transport keeps key order (driver.KeyOrderKeeper).
type keyOrdered struct{ driver.Transport }

func (keyOrdered) KeepsKeyOrder() bool { return true }
