package outboxotel_test

import (
	"context"
	"fmt"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxkit/outbox"
	outboxotel "github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

func Example() {
	ctx := context.Background()
	// The application's provider; here one with a reader the example can read.
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(ctx)

	obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider, MessagingSystem: "kafka"})
	if err != nil {
		panic(err)
	}
	defer obs.Close()

	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	for i := range 3 {
		_ = store.Enqueue(ctx, outbox.Message{Topic: "orders", Payload: fmt.Appendf(nil, "order %d", i)})
	}
	d, err := relay.New(store, outboxtest.NewRecorder(), relay.Config{Observer: obs})
	if err != nil {
		panic(err)
	}
	if _, err := d.RunOnce(ctx); err != nil {
		panic(err)
	}

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(ctx, &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if s, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "messaging.client.sent.messages" {
			dest, _ := s.DataPoints[0].Attributes.Value("messaging.destination.name")
			fmt.Println(m.Name, dest.AsString(), s.DataPoints[0].Value)
		}
	}
	// Output:
	// messaging.client.sent.messages orders 3
}
