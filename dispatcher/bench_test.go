package dispatcher

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memory"
)

// BenchmarkDrain measures how fast one relay drains a backlog of b.N messages with
// distinct keys from the memory store into the recording transport, per batch size
// and number of buckets drained in parallel (4 is the default; the memory store and
// the recorder each serialise on one lock, so parallel drains only pay off against
// stores and brokers with real latency).
func BenchmarkDrain(b *testing.B) {
	for _, conc := range []int{1, DefaultMaxConcurrency} {
		for _, batch := range []int{1, 100, 500} {
			benchDrain(b, batch, conc)
		}
	}
}

func benchDrain(b *testing.B, batch, conc int) {
	{
		b.Run("batch="+strconv.Itoa(batch)+"/concurrency="+strconv.Itoa(conc), func(b *testing.B) {
			ctx := context.Background()
			store, err := memory.New(memory.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			envs := make([]*outbox.Envelope, 0, 1000)
			for i := range b.N {
				env, err := outbox.NewEnvelope(outbox.Message{
					Topic:   "bench",
					Key:     fmt.Appendf(nil, "key-%d", i),
					Payload: make([]byte, 256),
				}, store.BucketCount())
				if err != nil {
					b.Fatal(err)
				}
				envs = append(envs, env)
				if len(envs) == cap(envs) || i == b.N-1 {
					if err := store.Enqueue(ctx, envs...); err != nil {
						b.Fatal(err)
					}
					envs = envs[:0]
				}
			}
			rec := outboxtest.NewRecorder()
			d, err := New(store, rec, Config{RelayID: "bench", BatchSize: batch, MaxConcurrency: conc, Logger: quietLogger()})
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
		})
	}
}
