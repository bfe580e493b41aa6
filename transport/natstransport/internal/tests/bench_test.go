package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// BenchmarkPublish measures the transport's publish throughput beside the raw
// JetStream client sending the same messages (same subject, 1 KiB random payloads,
// Nats-Msg-Id, message-id, idempotency-key and key headers) as asynchronous
// publishes waited on once per batch, in the same run, through the same connection,
// to one memory stream (so the server's disk does not hide the client's cost). A
// coin decides which goes first in each round. It reports msgs/s for both from the
// median round of each, their ratio (transport/raw; 1 means no overhead), and the
// ratio of the mean rounds.
func BenchmarkPublish(b *testing.B) {
	for _, size := range []int{100, 500} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			_, js := connect(b, natsURL())
			subject := streamName("bench")
			createStream(b, js, jetstream.StreamConfig{Subjects: []string{subject}, MaxMsgs: 100_000})
			tr := newTransport(b, js, natstransport.Config{})
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
						Topic:   subject,
						Key:     fmt.Appendf(nil, "key-%d", i%64),
						Payload: payloads[(round*size+i)%len(payloads)],
					})
				}
			}
			sendRaw := func() {
				futures := make([]jetstream.PubAckFuture, len(batch))
				for i, env := range batch {
					id := env.ID.String()
					msg := &nats.Msg{Subject: subject, Data: env.Payload, Header: nats.Header{
						jetstream.MsgIDHeader:       {id},
						outbox.HeaderMessageID:      {id},
						outbox.HeaderIdempotencyKey: {id},
						natstransport.HeaderKey:     {string(env.Key)},
					}}
					f, err := js.PublishMsgAsync(msg)
					if err != nil {
						b.Fatal(err)
					}
					futures[i] = f
				}
				for _, f := range futures {
					select {
					case <-f.Ok():
					case err := <-f.Err():
						b.Fatal(err)
					}
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
