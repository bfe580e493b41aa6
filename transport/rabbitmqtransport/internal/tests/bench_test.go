package tests

import (
	"context"
	"crypto/rand"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

const benchBatch = 100

// benchTopic declares a fanout exchange and a durable queue that keeps its newest
// 10,000 messages, so a long run does not fill the broker.
func benchTopic(b *testing.B) string {
	a := newAdmin(b)
	topic := uniqueName("bench")
	a.exchange(b, topic, amqp.ExchangeFanout)
	a.queue(b, topic, topic, "", amqp.Table{"x-max-length": int32(10_000)})
	return topic
}

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

// BenchmarkPublish compares the transport with the raw client doing the same work: a
// batch of 100 persistent, mandatory messages (256 random bytes each) published on a
// channel in confirm mode and waited on once. The raw loop sets only the message id
// property and an id header; the transport also writes the key, the header order and
// the idempotency key. Each iteration runs one round of each side, in an order a coin
// decides, on queues of their own; the metrics are the median rounds, so a stall of
// the shared machine weighs on neither side alone:
//
//	go test -run '^$' -bench BenchmarkPublish -benchtime 300x -count 3 ./internal/tests/
func BenchmarkPublish(b *testing.B) {
	needBroker(b)
	ctx := context.Background()
	rawTopic, trTopic := benchTopic(b), benchTopic(b)
	rawBatch, trBatch := benchEnvelopes(b, rawTopic), benchEnvelopes(b, trTopic)

	conn, err := dialer("")(ctx)
	require.NoError(b, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(b, err)
	require.NoError(b, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp.Return, benchBatch))
	dcs := make([]*amqp.DeferredConfirmation, benchBatch)
	raw := func() {
		for i, env := range rawBatch {
			id := env.ID.String()
			dcs[i], err = ch.PublishWithDeferredConfirm(rawTopic, "", true, false, amqp.Publishing{
				Headers:      amqp.Table{outbox.HeaderMessageID: id},
				MessageId:    id,
				DeliveryMode: amqp.Persistent,
				Body:         env.Payload,
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		for _, dc := range dcs {
			if !dc.Wait() {
				b.Fatal("nacked")
			}
		}
		select {
		case r := <-returns:
			b.Fatalf("returned: %s", r.ReplyText)
		default:
		}
	}

	tr := newTransport(b, "", rabbitmqtransport.Config{Route: func(env *driver.Envelope) (string, string) { return env.Topic, "" }})
	require.NoError(b, tr.Ping(ctx)) // dial outside the timer, as the raw side does
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
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
