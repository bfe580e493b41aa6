package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// BenchmarkPublish measures the transport's publish throughput beside the raw kgo
// client sending the same records (same topic and keys, 1 KiB incompressible
// payloads, message-id and idempotency-key headers) with one ProduceSync per batch,
// in the same run, through the same client and in-process cluster. A coin decides
// which goes first in each round. It reports msgs/s for both from the median round
// of each, their ratio (transport/raw; 1 means no overhead), and the ratio of the
// mean rounds, which occasional stalls of tens of milliseconds make noisy.
func BenchmarkPublish(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			c := newCluster(b, 8, "bench")
			// Both sides share one client, so that connections, producer id and
			// partition leaders are the same and only the transport's work differs.
			raw := newClient(b, c)
			tr, err := kafkatransport.New(raw, kafkatransport.Config{})
			require.NoError(b, err)
			ctx := context.Background()

			payloads := make([][]byte, 1024)
			for i := range payloads {
				payloads[i] = make([]byte, 1024)
				_, _ = rand.Read(payloads[i])
			}
			batch := make([]*driver.Envelope, size)
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

			// Each round times both sides; the medians resist the pauses other work on
			// the machine injects into single rounds.
			var rawTimes, trTimes []time.Duration
			rounds := 0
			order := mrand.New(mrand.NewPCG(1, uint64(size)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				b.StopTimer()
				nextBatch(rounds)
				b.StartTimer()
				first, second := sendRaw, sendTransport
				firstTimes, secondTimes := &rawTimes, &trTimes
				// A coin decides who goes first. Not a fixed alternation: the longest
				// stalls recur at round numbers that double (255, 511, 1023, ...), and
				// a fixed order would always pin them on one side.
				if order.IntN(2) == 1 {
					first, second = second, first
					firstTimes, secondTimes = secondTimes, firstTimes
				}
				start := time.Now()
				first()
				mid := time.Now()
				second()
				*firstTimes = append(*firstTimes, mid.Sub(start))
				*secondTimes = append(*secondTimes, time.Since(mid))
				rounds++
			}
			rawMedian, trMedian := median(rawTimes), median(trTimes)
			b.ReportMetric(float64(size)/trMedian.Seconds(), "msgs/s")
			b.ReportMetric(float64(size)/rawMedian.Seconds(), "raw-msgs/s")
			b.ReportMetric(rawMedian.Seconds()/trMedian.Seconds(), "ratio")
			// The ratio of the means keeps the slow rounds in.
			b.ReportMetric(sum(rawTimes).Seconds()/sum(trTimes).Seconds(), "mean-ratio")
		})
	}
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func sum(ds []time.Duration) time.Duration {
	var total time.Duration
	for _, d := range ds {
		total += d
	}
	return total
}
