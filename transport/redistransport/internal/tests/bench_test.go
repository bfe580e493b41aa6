package tests

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// rawPublish is the baseline: the raw client appending the same entries (message
// id, key, payload and idempotency-key fields) as one pipeline per batch, through
// the transport's client.
func rawPublish(tb testing.TB, tr driver.Transport) func(context.Context, []*driver.Envelope) error {
	var client *redis.Client
	require.True(tb, tr.(*redistransport.Transport).As(&client))
	return func(ctx context.Context, batch []*driver.Envelope) error {
		pipe := client.Pipeline()
		for _, env := range batch {
			id := env.ID.String()
			pipe.XAdd(ctx, &redis.XAddArgs{Stream: env.Topic, ID: "*", Values: []any{
				redistransport.FieldMessageID, id,
				redistransport.FieldKey, env.Key,
				redistransport.FieldPayload, env.Payload,
				redistransport.FieldIdempotencyKey, id,
			}})
		}
		_, err := pipe.Exec(ctx)
		return err
	}
}

// BenchmarkPublish runs the relay suite's benchmark: the transport's Publish beside
// the raw client on one client, and the relay draining a memory store through it.
func BenchmarkPublish(b *testing.B) {
	relaysuite.Benchmark(b, relayHarness())
}
