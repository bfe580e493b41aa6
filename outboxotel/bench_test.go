package outboxotel_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	outboxotel "github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// BenchmarkDrainObserved drains b.N messages (batches of 100, 4 topics) from the
// memory store into the recording transport with no observer, and with the
// OpenTelemetry observer recording into an SDK provider: the difference is what the
// metrics cost per message.
func BenchmarkDrainObserved(b *testing.B) {
	for _, observed := range []bool{false, true} {
		b.Run(fmt.Sprintf("observer=%t", observed), func(b *testing.B) {
			ctx := context.Background()
			store, err := memstore.New(memstore.Config{})
			if err != nil {
				b.Fatal(err)
			}
			defer store.Close()
			envs := make([]*driver.Envelope, 0, 1000)
			for i := range b.N {
				env, err := driver.NewEnvelope(outbox.Message{Topic: fmt.Sprintf("topic-%d", i%4), Key: fmt.Appendf(nil, "key-%d", i), Payload: make([]byte, 256)}, store.Driver().BucketCount())
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
			cfg := relay.Config{RelayID: "bench", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if observed {
				provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
				defer provider.Shutdown(ctx)
				obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider, MessagingSystem: "kafka"})
				if err != nil {
					b.Fatal(err)
				}
				cfg.Observer = obs
			}
			d, err := relay.New(store, outboxtest.NewRecorder(), cfg)
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
