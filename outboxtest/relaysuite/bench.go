package relaysuite

import (
	"context"
	"crypto/rand"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
)

// roundsPerTopic is how many benchmark rounds publish to one topic before the next
// round moves to a fresh one, so that no queue grows without bound (some brokers slow
// down as a queue grows).
const roundsPerTopic = 20

// benchKeys is the number of distinct keys in a benchmark batch.
const benchKeys = 64

// Benchmark measures the transport against its broker, with New's transports (a nil
// dial) and, for the baseline, the harness's Raw:
//
//   - Publish/batch=100, Publish/batch=500: Publish calls of batches of 1 KiB random
//     (incompressible) payloads over 64 keys. With Raw, each round times one call of
//     each side, in an order a coin decides, and the benchmark reports msgs/s (the
//     transport's median round), raw-msgs/s (the baseline's), ratio (their quotient:
//     1 means no overhead, above 1 the transport is faster) and mean-ratio (the same
//     of the mean rounds, which a few stalled rounds decide). Without Raw it reports
//     msgs/s alone.
//   - Relay/backlog=500: each round writes 500 such messages to the store in one
//     call, outside the timer, and RunOnce sweeps relay them through the transport;
//     it reports msgs/s from the median round.
//
// Every 20 rounds both move to a fresh topic made by New (outside the timer), so no
// queue grows past 20 rounds; each fresh topic is warmed up by one untimed round.
func Benchmark(b *testing.B, h Harness) {
	require.NotNil(b, h.New, "Harness.New is required")
	payloads := make([][]byte, 1024)
	for i := range payloads {
		payloads[i] = make([]byte, 1024)
		_, _ = rand.Read(payloads[i])
	}
	b.Run("Publish", func(b *testing.B) {
		for _, size := range []int{100, 500} {
			b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) { benchPublish(b, h, payloads, size) })
		}
	})
	b.Run("Relay", func(b *testing.B) {
		b.Run("backlog=500", func(b *testing.B) { benchRelay(b, h, payloads, 500) })
	})
}

// benchMessage is message i of round round: one of 64 keys, one of the payloads.
func benchMessage(topic string, payloads [][]byte, round, size, i int) outbox.Message {
	return outbox.Message{
		Topic:   topic,
		Key:     fmt.Appendf(nil, "key-%d", i%benchKeys),
		Payload: payloads[(round*size+i)%len(payloads)],
	}
}

func benchPublish(b *testing.B, h Harness, payloads [][]byte, size int) {
	ctx := context.Background()
	var (
		topic string
		tr    driver.Transport
		raw   func(ctx context.Context, batch []*driver.Envelope) error
	)
	batch := make([]*driver.Envelope, size)
	fill := func(round int) {
		for i := range batch {
			env, err := driver.NewEnvelope(benchMessage(topic, payloads, round, size, i), Buckets)
			require.NoError(b, err)
			batch[i] = env
		}
	}
	sendTransport := func() {
		if err := tr.Publish(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	sendRaw := func() {
		if err := raw(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	fresh := func(round int) {
		topic = topicName("bench")
		tr = h.New(b, topic, nil)
		if h.Raw != nil {
			raw = h.Raw(b, tr)
		}
		// Warm both sides up: metadata, connections, producer ids.
		fill(round)
		sendTransport()
		if raw != nil {
			sendRaw()
		}
	}
	fresh(0)

	var trTimes, rawTimes []time.Duration
	coin := mrand.New(mrand.NewPCG(1, uint64(size)))
	round := 0
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		if round > 0 && round%roundsPerTopic == 0 {
			fresh(round)
		}
		fill(round)
		b.StartTimer()
		if raw == nil {
			start := time.Now()
			sendTransport()
			trTimes = append(trTimes, time.Since(start))
			round++
			continue
		}
		first, second := sendRaw, sendTransport
		firstTimes, secondTimes := &rawTimes, &trTimes
		// A coin, not a fixed alternation: stalls that recur at regular round numbers
		// would always land on one side.
		if coin.IntN(2) == 1 {
			first, second = second, first
			firstTimes, secondTimes = secondTimes, firstTimes
		}
		start := time.Now()
		first()
		mid := time.Now()
		second()
		*firstTimes = append(*firstTimes, mid.Sub(start))
		*secondTimes = append(*secondTimes, time.Since(mid))
		round++
	}
	b.StopTimer()
	trMedian := median(trTimes)
	b.ReportMetric(float64(size)/trMedian.Seconds(), "msgs/s")
	if raw != nil {
		rawMedian := median(rawTimes)
		b.ReportMetric(float64(size)/rawMedian.Seconds(), "raw-msgs/s")
		b.ReportMetric(rawMedian.Seconds()/trMedian.Seconds(), "ratio")
		b.ReportMetric(sum(rawTimes).Seconds()/sum(trTimes).Seconds(), "mean-ratio")
	}
}

func benchRelay(b *testing.B, h Harness, payloads [][]byte, backlog int) {
	ctx := context.Background()
	st := suite{h: h}.store(b)
	var (
		topic string
		d     *relay.Relay
	)
	fresh := func() {
		topic = topicName("bench")
		cfg := config("bench")
		cfg.BatchSize = 100
		d = newRelay(b, st, h.New(b, topic, nil), cfg)
	}
	fill := func(round int) {
		msgs := make([]outbox.Message, backlog)
		for i := range msgs {
			msgs[i] = benchMessage(topic, payloads, round, backlog, i)
		}
		require.NoError(b, st.Enqueue(ctx, msgs...))
	}
	drain := func() {
		want := d.Stats().Published + int64(backlog)
		for sweep := 0; ; sweep++ {
			before := d.Stats().Published
			if before >= want {
				return
			}
			if sweep == 1000 {
				b.Fatalf("%d sweeps left %d messages pending", sweep, want-before)
			}
			if _, err := d.RunOnce(ctx); err != nil {
				b.Fatal(err)
			}
			if d.Stats().Published == before {
				time.Sleep(20 * time.Millisecond) // a failure backs off for at most this
			}
		}
	}
	fresh()
	fill(0)
	drain()

	var times []time.Duration
	round := 0
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		if round > 0 && round%roundsPerTopic == 0 {
			fresh()
			fill(round)
			drain()
		}
		fill(round)
		b.StartTimer()
		start := time.Now()
		drain()
		times = append(times, time.Since(start))
		round++
	}
	b.StopTimer()
	b.ReportMetric(float64(backlog)/median(times).Seconds(), "msgs/s")
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
