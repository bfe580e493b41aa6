package tests

import (
	"context"
	"encoding/base64"
	"strconv"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
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
					outbox.HeaderIdempotencyKey: {DataType: aws.String("String"), StringValue: aws.String(env.ID.String())},
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

// BenchmarkPublish runs the relay suite's benchmark against the shared emulator: the
// transport's Publish beside the raw SDK client making the same requests, each side
// on a fresh queue every few rounds (the emulator keeps every message in memory and
// slows as a queue grows), and the relay draining a memory store through it.
func BenchmarkPublish(b *testing.B) {
	relaysuite.Benchmark(b, relayHarness(false))
}
