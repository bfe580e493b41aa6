package tests

import (
	"context"
	"fmt"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// BenchmarkHandle measures what one stream invocation costs in DynamoDB requests
// per message it publishes (the writes that created the messages are not counted):
// events of one record, of ten records in one bucket, and of ten records in ten
// buckets. Run with -benchtime=200x; the requests per message are the figure that
// carries over to DynamoDB.
func BenchmarkHandle(b *testing.B) {
	for _, tc := range []struct {
		name             string
		records, buckets int
	}{
		{"1record", 1, 1},
		{"10records-1bucket", 10, 1},
		{"10records-10buckets", 10, 10},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d := newTestDB(b)
			s := d.newStore(b, dynamostore.Config{BucketCount: 16})
			rec := outboxtest.NewRecorder()
			rec.CountOnly = true
			_, h := newHandlerB(b, s, rec)
			keys := make([][]byte, tc.buckets)
			for i := range keys {
				keys[i] = keyFor(b, i, 16)
			}
			ctx := context.Background()
			reqs := map[string]int{}
			messages := 0
			for b.Loop() {
				b.StopTimer()
				var st streamOf
				for i := range tc.records {
					env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: keys[i%tc.buckets], Payload: make([]byte, 256)}, 16)
					require.NoError(b, err)
					require.NoError(b, s.Driver().Enqueue(ctx, env))
					st.add(events.DynamoDBOperationTypeInsert, fmt.Sprintf("OUTBOX#MESSAGES#%d", env.Bucket), fmt.Sprintf("%019d", env.Seq))
				}
				d.take()
				b.StartTimer()
				resp, err := h.Handle(ctx, st.ev)
				require.NoError(b, err)
				require.Empty(b, resp.BatchItemFailures)
				for op, n := range d.take() {
					reqs[op] += n
				}
				messages += tc.records
			}
			require.Equal(b, messages, rec.Unique())
			per := func(n int) float64 { return float64(n) / float64(messages) }
			b.ReportMetric(per(reqs["Query"]), "queries/msg")
			b.ReportMetric(per(reqs["PutItem"]+reqs["UpdateItem"]), "writes/msg")
			b.ReportMetric(per(reqs["BatchWriteItem"]), "batchwrites/msg")
			b.ReportMetric(per(reqs["Query"]+reqs["PutItem"]+reqs["UpdateItem"]+reqs["BatchWriteItem"]+reqs["TransactWriteItems"]), "requests/msg")
		})
	}
}
