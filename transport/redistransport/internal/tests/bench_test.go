package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// BenchmarkPublish measures the transport's publish throughput beside the raw client
// appending the same entries (same stream, 1 KiB random payloads, message id, key,
// payload and idempotency-key fields, XADD MAXLEN ~ 100000) as one pipeline per batch,
// in the same run, through the same client. A coin decides which goes first in each
// round. It reports msgs/s for both from the median round of each, their ratio
// (transport/raw; 1 means no overhead), and the ratio of the mean rounds.
func BenchmarkPublish(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			client := connect(b, redisAddr())
			stream := streamKey(b, client, "bench")
			const maxLen = 100_000
			tr := newTransport(b, client, redistransport.Config{MaxLen: maxLen})
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
						Topic:   stream,
						Key:     fmt.Appendf(nil, "key-%d", i%64),
						Payload: payloads[(round*size+i)%len(payloads)],
					})
				}
			}
			sendRaw := func() {
				pipe := client.Pipeline()
				for _, env := range batch {
					id := env.ID.String()
					pipe.XAdd(ctx, &redis.XAddArgs{Stream: stream, MaxLen: maxLen, Approx: true, ID: "*", Values: []any{
						redistransport.FieldMessageID, id,
						redistransport.FieldKey, env.Key,
						redistransport.FieldPayload, env.Payload,
						redistransport.FieldIdempotencyKey, id,
					}})
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			sendTransport := func() { require.NoError(b, tr.Publish(ctx, batch)) }

			nextBatch(0)
			sendRaw()
			sendTransport()

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
