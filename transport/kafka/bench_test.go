package kafka_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/kafka"
)

// BenchmarkPublish measures the transport's publish throughput beside the raw kgo
// client sending the same records (same topic, keys, 1 KiB incompressible payloads
// message-id and idempotency-key headers) with one ProduceSync per batch, in the same run against the
// same in-process cluster. It reports msgs/s for both and their ratio
// (transport/raw; 1 means no overhead). The two alternate which goes first.
func BenchmarkPublish(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			c := newCluster(b, 8, "bench")
			tr := newTransport(b, c, kafka.Config{})
			raw := newClient(b, c)
			ctx := context.Background()

			payloads := make([][]byte, 1024)
			for i := range payloads {
				payloads[i] = make([]byte, 1024)
				_, _ = rand.Read(payloads[i])
			}
			batch := make([]*outbox.Envelope, size)
			nextBatch := func(round int) {
				for i := range batch {
					batch[i] = envelope(b, outbox.Message{
						Topic:   "bench",
						Key:     fmt.Appendf(nil, "key-%d", i%64),
						Payload: payloads[(round*size+i)%len(payloads)],
					})
				}
			}
			sendRaw := func() {
				recs := make([]*kgo.Record, len(batch))
				for i, env := range batch {
					id := []byte(env.ID.String())
					recs[i] = &kgo.Record{
						Topic: env.Topic,
						Key:   env.Key,
						Value: env.Payload,
						Headers: []kgo.RecordHeader{
							{Key: outbox.HeaderMessageID, Value: id},
							{Key: outbox.HeaderIdempotencyKey, Value: id},
						},
					}
				}
				if err := raw.ProduceSync(ctx, recs...).FirstErr(); err != nil {
					b.Fatal(err)
				}
			}
			sendTransport := func() { require.NoError(b, tr.Publish(ctx, batch)) }

			// Warm both clients up: metadata, producer ids, connections.
			nextBatch(0)
			sendRaw()
			sendTransport()

			var rawTime, trTime time.Duration
			rounds := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				b.StopTimer()
				nextBatch(rounds)
				b.StartTimer()
				first, second := sendRaw, sendTransport
				firstTime, secondTime := &rawTime, &trTime
				if rounds%2 == 1 {
					first, second = second, first
					firstTime, secondTime = secondTime, firstTime
				}
				start := time.Now()
				first()
				mid := time.Now()
				second()
				*firstTime += mid.Sub(start)
				*secondTime += time.Since(mid)
				rounds++
			}
			msgs := float64(rounds * size)
			b.ReportMetric(msgs/trTime.Seconds(), "msgs/s")
			b.ReportMetric(msgs/rawTime.Seconds(), "raw-msgs/s")
			b.ReportMetric(rawTime.Seconds()/trTime.Seconds(), "ratio")
		})
	}
}
