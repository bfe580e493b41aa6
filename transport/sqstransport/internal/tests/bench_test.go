package tests

import (
	"context"
	"encoding/base64"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// rawPublish is what a hand-written relay would do with the SDK: the same
// SendMessageBatch requests of ten, byte for byte the same bodies and attributes,
// the same number of requests in flight, no outbox bookkeeping.
func rawPublish(ctx context.Context, client *sqs.Client, url string, batch []*driver.Envelope, concurrency int) error {
	var (
		wg       sync.WaitGroup
		sem      = make(chan struct{}, concurrency)
		mu       sync.Mutex
		firstErr error
	)
	for start := 0; start < len(batch); start += 10 {
		chunk := batch[start:min(start+10, len(batch))]
		entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
		for i, env := range chunk {
			entries[i] = types.SendMessageBatchRequestEntry{
				Id:          aws.String(strconv.Itoa(i)),
				MessageBody: aws.String(base64.StdEncoding.EncodeToString(env.Payload)),
				MessageAttributes: map[string]types.MessageAttributeValue{
					outbox.HeaderMessageID:      {DataType: aws.String("String"), StringValue: aws.String(env.ID.String())},
					sqstransport.AttrKey:        {DataType: aws.String("String"), StringValue: aws.String(string(env.Key))},
					outbox.HeaderIdempotencyKey: {DataType: aws.String("String"), StringValue: aws.String("k")},
					sqstransport.AttrLayout:     {DataType: aws.String("String"), StringValue: aws.String("body=base64")},
				},
			}
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out, err := client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
			if err == nil && len(out.Failed) > 0 {
				err = &sqstransport.EntryError{Code: aws.ToString(out.Failed[0].Code)}
			}
			if err != nil {
				mu.Lock()
				firstErr = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// BenchmarkPublish publishes batches of 100 messages with 1 KiB incompressible
// payloads through the transport and, alternately in the same run, through the raw
// SDK client making the same requests. It reports both rates and their ratio.
func BenchmarkPublish(b *testing.B) {
	srv := emulator.Shared(b)
	client := srv.Client()
	ctx := context.Background()

	// The emulator keeps every message in memory and slows as a queue grows: both
	// sides publish to a fresh queue every few rounds, and old ones are deleted.
	var url string
	var tr *sqstransport.Transport
	fresh := func() {
		if url != "" {
			_, err := client.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(url)})
			require.NoError(b, err)
		}
		url = srv.CreateQueue(b, queueName("bench", false), nil)
		var err error
		tr, err = sqstransport.New(client, sqstransport.Config{Resolver: sqstransport.Queues{"bench": url}})
		require.NoError(b, err)
	}
	fresh()

	const batchSize = 100
	batch := make([]*driver.Envelope, batchSize)
	for i := range batch {
		env, err := driver.NewEnvelope(outbox.Message{
			Topic:   "bench",
			Key:     []byte(strconv.Itoa(i % 16)),
			Payload: randomBytes(1024),
			Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("k")}},
		}, 8)
		require.NoError(b, err)
		batch[i] = env
	}

	var transportTime, rawTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		if i > 0 && i%20 == 0 {
			fresh()
		}
		// Alternate which side goes first, so neither always meets the emulator just
		// after the other's garbage.
		sides := []func() error{
			func() error {
				start := time.Now()
				err := tr.Publish(ctx, batch)
				transportTime += time.Since(start)
				return err
			},
			func() error {
				start := time.Now()
				err := rawPublish(ctx, client, url, batch, sqstransport.DefaultConcurrency)
				rawTime += time.Since(start)
				return err
			},
		}
		if i%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, side := range sides {
			if err := side(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	msgs := float64(b.N * batchSize)
	b.ReportMetric(msgs/transportTime.Seconds(), "transport-msgs/s")
	b.ReportMetric(msgs/rawTime.Seconds(), "raw-msgs/s")
	b.ReportMetric(rawTime.Seconds()/transportTime.Seconds(), "transport/raw")
	b.ReportMetric(0, "ns/op")
}
