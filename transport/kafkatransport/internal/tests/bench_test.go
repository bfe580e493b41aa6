package tests

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// rawProduce is the baseline: the raw kgo client sending the same records (same
// topic and keys, message-id and idempotency-key headers) with one ProduceSync per
// batch. It shares the transport's client, so that connections, producer id and
// partition leaders are the same and only the transport's work differs.
func rawProduce(tb testing.TB, tr driver.Transport) func(context.Context, []*driver.Envelope) error {
	var client *kgo.Client
	require.True(tb, tr.(*kafkatransport.Transport).As(&client))
	return func(ctx context.Context, batch []*driver.Envelope) error {
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
		return client.ProduceSync(ctx, recs...).FirstErr()
	}
}

// BenchmarkPublish runs the relay suite's benchmark: the transport's Publish beside
// the raw client, in the same run, through the same client and in-process cluster
// (8 partitions), with incompressible payloads (kgo's default snappy would flatter
// repeated bytes), and the relay draining a memory store through it.
func BenchmarkPublish(b *testing.B) {
	relaysuite.Benchmark(b, relayHarness())
}
