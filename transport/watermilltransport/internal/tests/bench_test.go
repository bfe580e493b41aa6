package tests

import (
	"context"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// rawPublish is the baseline: the transport's Watermill publisher called directly, one
// Publish call per batch to the topic's durable queue with delivery confirmation
// (which Watermill's AMQP publisher waits for message by message). It sets the
// message UUID and an id metadata entry; the transport also writes the key, the
// header list, the topic and the idempotency key.
func rawPublish(tb testing.TB, tr driver.Transport) func(context.Context, []*driver.Envelope) error {
	var pub message.Publisher
	require.True(tb, tr.(*watermilltransport.Transport).As(&pub))
	return func(_ context.Context, batch []*driver.Envelope) error {
		msgs := make([]*message.Message, len(batch))
		for i, env := range batch {
			id := env.ID.String()
			msgs[i] = message.NewMessage(id, env.Payload)
			msgs[i].Metadata.Set(outbox.HeaderMessageID, id)
		}
		return pub.Publish(batch[0].Topic, msgs...)
	}
}

// BenchmarkPublish runs the relay suite's benchmark: the transport's Publish beside
// the same Watermill publisher called directly, and the relay draining a memory
// store through it:
//
//	go test -run '^$' -bench BenchmarkPublish -benchtime 40x -count 3 ./internal/tests/
func BenchmarkPublish(b *testing.B) {
	needBroker(b)
	relaysuite.Benchmark(b, relayHarness())
}
