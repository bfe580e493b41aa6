package tests

import (
	"context"
	"crypto/rand"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

const benchBatch = 50

func benchEnvelopes(b *testing.B, topic string) []*driver.Envelope {
	batch := make([]*driver.Envelope, benchBatch)
	for i := range batch {
		payload := make([]byte, 256)
		_, _ = rand.Read(payload)
		env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: []byte{byte('a' + i%16)}, Payload: payload}, driver.DefaultBucketCount)
		require.NoError(b, err)
		batch[i] = env
	}
	return batch
}

// BenchmarkPublish compares the transport with the same Watermill AMQP publisher
// called directly: a batch of 50 messages (256 random bytes each) in one Publish call
// to a durable queue, with delivery confirmation (which Watermill's AMQP publisher
// waits for message by message). The direct call sets the message UUID and an id
// metadata entry; the transport also writes the key, the header list, the topic and
// the idempotency key. Each iteration runs one round of each, in an order a coin
// decides; the metrics are the median rounds:
//
//	go test -run '^$' -bench BenchmarkPublish -benchtime 40x -count 3 ./internal/tests/
func BenchmarkPublish(b *testing.B) {
	needBroker(b)
	ctx := context.Background()
	a := newAdmin(b)
	rawTopic, trTopic := uniqueName("bench-raw"), uniqueName("bench-tr")
	a.queue(b, rawTopic, nil)
	a.queue(b, trTopic, nil)
	pub := publisher(b, "")
	tr := newTransport(b, pub, watermilltransport.Config{})
	rawBatch, trBatch := benchEnvelopes(b, rawTopic), benchEnvelopes(b, trTopic)

	raw := func() {
		msgs := make([]*message.Message, len(rawBatch))
		for i, env := range rawBatch {
			id := env.ID.String()
			msgs[i] = message.NewMessage(id, env.Payload)
			msgs[i].Metadata.Set(outbox.HeaderMessageID, id)
		}
		if err := pub.Publish(rawTopic, msgs...); err != nil {
			b.Fatal(err)
		}
	}
	transport := func() {
		if err := tr.Publish(ctx, trBatch); err != nil {
			b.Fatal(err)
		}
	}
	var rawRounds, trRounds []time.Duration
	timed := func(f func(), into *[]time.Duration) {
		start := time.Now()
		f()
		*into = append(*into, time.Since(start))
	}
	b.ResetTimer()
	for range b.N {
		if mrand.IntN(2) == 0 {
			timed(raw, &rawRounds)
			timed(transport, &trRounds)
		} else {
			timed(transport, &trRounds)
			timed(raw, &rawRounds)
		}
	}
	b.StopTimer()
	rawMedian, trMedian := median(rawRounds), median(trRounds)
	b.ReportMetric(benchBatch/rawMedian.Seconds(), "raw-msgs/s")
	b.ReportMetric(benchBatch/trMedian.Seconds(), "transport-msgs/s")
	b.ReportMetric(rawMedian.Seconds()/trMedian.Seconds(), "ratio")
	_, _ = a.ch.QueuePurge(rawTopic, false)
	_, _ = a.ch.QueuePurge(trTopic, false)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
