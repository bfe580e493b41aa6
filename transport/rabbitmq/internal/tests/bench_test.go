package tests

import (
	"context"
	"crypto/rand"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/rabbitmq"
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

func benchEnvelopes(b *testing.B, topic string) []*outbox.Envelope {
	batch := make([]*outbox.Envelope, benchBatch)
	for i := range batch {
		payload := make([]byte, 256)
		_, _ = rand.Read(payload)
		env, err := outbox.NewEnvelope(outbox.Message{Topic: topic, Key: []byte{byte('a' + i%16)}, Payload: payload}, outbox.DefaultBucketCount)
		require.NoError(b, err)
		batch[i] = env
	}
	return batch
}

// BenchmarkPublish compares the transport with the raw client doing the same work: a
// batch of 100 persistent, mandatory messages (256 random bytes each) published on a
// channel in confirm mode and waited on once. The raw loop sets only the message id
// property and an id header; the transport also writes the key, header order and
// idempotency key. Run both in one go so they meet the same broker:
//
//	go test -run '^$' -bench BenchmarkPublish -benchtime 200x ./internal/tests/
func BenchmarkPublish(b *testing.B) {
	needBroker(b)
	b.Run("raw", func(b *testing.B) {
		topic := benchTopic(b)
		batch := benchEnvelopes(b, topic)
		conn, err := dialer("")(context.Background())
		require.NoError(b, err)
		defer conn.Close()
		ch, err := conn.Channel()
		require.NoError(b, err)
		require.NoError(b, ch.Confirm(false))
		returns := ch.NotifyReturn(make(chan amqp.Return, benchBatch))
		dcs := make([]*amqp.DeferredConfirmation, benchBatch)
		b.ResetTimer()
		for range b.N {
			for i, env := range batch {
				id := env.ID.String()
				dcs[i], err = ch.PublishWithDeferredConfirm(topic, "", true, false, amqp.Publishing{
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
		b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("transport", func(b *testing.B) {
		topic := benchTopic(b)
		batch := benchEnvelopes(b, topic)
		tr := newTransport(b, "", rabbitmq.Config{Route: func(env *outbox.Envelope) (string, string) { return env.Topic, "" }})
		ctx := context.Background()
		require.NoError(b, tr.Ping(ctx)) // dial outside the timer, as the raw loop does
		b.ResetTimer()
		for range b.N {
			if err := tr.Publish(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*benchBatch)/b.Elapsed().Seconds(), "msgs/s")
	})
}
