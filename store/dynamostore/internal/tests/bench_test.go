package tests

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// reportCost turns the proxy's request counts into requests per message, the figure
// that maps to cost on DynamoDB: reads (Query, GetItem, BatchGetItem), single-item
// writes (PutItem, UpdateItem, DeleteItem), BatchWriteItem requests and transactions.
func reportCost(b *testing.B, reqs map[string]int, messages int) {
	per := func(n int) float64 { return float64(n) / float64(messages) }
	b.ReportMetric(per(reqs["Query"]+reqs["GetItem"]+reqs["BatchGetItem"]), "reads/msg")
	b.ReportMetric(per(reqs["PutItem"]+reqs["UpdateItem"]+reqs["DeleteItem"]), "writes/msg")
	b.ReportMetric(per(reqs["BatchWriteItem"]), "batchwrites/msg")
	b.ReportMetric(per(reqs["TransactWriteItems"]), "txns/msg")
	b.ReportMetric(float64(messages)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkEnqueue measures writing messages: one at a time, ten per Enqueue call
// (keys spread over the buckets), and one per unit of work beside a business item.
// The API server copies its whole table for every transaction (to roll back), so
// transactional modes slow down as the table grows: keep b.N modest
// (-benchtime=300x); the requests per message are the figure that carries over.
func BenchmarkEnqueue(b *testing.B) {
	for _, mode := range []string{"single", "batch10", "commit"} {
		b.Run(mode, func(b *testing.B) {
			d := newTestDB(b)
			s := d.newStore(b, dynamostore.Config{BucketCount: 8})
			ctx := context.Background()
			payload := make([]byte, 256)
			send, err := outbox.NewSender(s, outbox.SenderConfig{})
			require.NoError(b, err)
			messages := 0
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				switch mode {
				case "single":
					require.NoError(b, s.Driver().Enqueue(ctx, envelope(b, 8, "t", fmt.Appendf(nil, "k%d", i), payload)))
					messages++
				case "batch10":
					envs := make([]*driver.Envelope, 10)
					for j := range envs {
						envs[j] = envelope(b, 8, "t", fmt.Appendf(nil, "k%d-%d", i, j), payload)
					}
					require.NoError(b, s.Driver().Enqueue(ctx, envs...))
					messages += 10
				case "commit":
					require.NoError(b, s.Transact(ctx, func(ctx context.Context) error {
						if err := dynamostore.AddItems(ctx, types.TransactWriteItem{Put: &types.Put{
							TableName: aws.String(s.Config().TableName),
							Item: map[string]types.AttributeValue{
								"PK": &types.AttributeValueMemberS{Value: fmt.Sprintf("ORDER#%d", i)},
								"SK": &types.AttributeValueMemberS{Value: "ORDER"},
							},
						}}); err != nil {
							return err
						}
						return send.Send(ctx, outbox.Message{Topic: "t", Key: fmt.Appendf(nil, "k%d", i), Payload: payload})
					}))
					messages++
				}
			}
			reqs, _ := d.proxy.take()
			reportCost(b, reqs, messages)
		})
	}
}

// BenchmarkDrain measures a relay draining a backlog of b.N messages spread over
// eight buckets into a recording transport, one RunOnce sweep after another. The
// API server's queries scan its whole table, so keep b.N modest (-benchtime=2000x).
func BenchmarkDrain(b *testing.B) {
	for _, batch := range []int{25, 100} {
		b.Run(fmt.Sprintf("batch%d", batch), func(b *testing.B) {
			d := newTestDB(b)
			s := d.newStore(b, dynamostore.Config{BucketCount: 8})
			ctx := context.Background()
			payload := make([]byte, 256)
			for i := 0; i < b.N; i += 100 {
				envs := make([]*driver.Envelope, min(100, b.N-i))
				for j := range envs {
					envs[j] = envelope(b, 8, "t", fmt.Appendf(nil, "k%d", (i+j)%512), payload)
				}
				require.NoError(b, s.Driver().Enqueue(ctx, envs...))
			}
			rec := outboxtest.NewRecorder()
			disp, err := relay.New(s, rec, relay.Config{
				RelayID: "bench", BucketCount: 8, BatchSize: batch, MaxConcurrency: 8,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			require.NoError(b, err)
			d.proxy.take()
			b.ResetTimer()
			for rec.Unique() < b.N {
				_, err := disp.RunOnce(ctx)
				require.NoError(b, err)
			}
			b.StopTimer()
			reqs, refused := d.proxy.take()
			require.Zero(b, refused)
			reportCost(b, reqs, b.N)
		})
	}
}
