package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// sqsBroker publishes through transport/sqstransport to one queue and reads it back,
// deleting what it read.
type sqsBroker struct {
	*sqstransport.Transport
	client   *sqs.Client
	queueURL string
	received []delivery
}

// openSQS connects to the SQS endpoint, finds or creates the queue and empties it of
// messages earlier runs left there.
func openSQS(ctx context.Context, endpoint, queue string) (*sqsBroker, error) {
	client := sqs.New(sqs.Options{
		Region:       cmp.Or(os.Getenv("AWS_REGION"), "us-east-1"),
		BaseEndpoint: aws.String(endpoint),
		// Emulators accept any credentials; real SQS wants the caller's.
		Credentials: credentials.NewStaticCredentialsProvider(
			cmp.Or(os.Getenv("AWS_ACCESS_KEY_ID"), "test"),
			cmp.Or(os.Getenv("AWS_SECRET_ACCESS_KEY"), "test"),
			os.Getenv("AWS_SESSION_TOKEN")),
	})
	b := &sqsBroker{client: client, queueURL: queue}
	if !strings.Contains(queue, "://") {
		url, err := queueURL(ctx, client, queue)
		if err != nil {
			return nil, err
		}
		b.queueURL = url
	}
	var err error
	b.Transport, err = sqstransport.New(client, sqstransport.Config{
		Resolver: sqstransport.Queues{topic: b.queueURL},
	})
	if err != nil {
		return nil, err
	}
	if _, err := b.receive(ctx); err != nil { // leftovers, unread
		return nil, err
	}
	return b, nil
}

// queueURL looks the queue up by name and creates it if it does not exist.
func queueURL(ctx context.Context, client *sqs.Client, name string) (string, error) {
	got, err := client.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String(name)})
	if err == nil {
		return aws.ToString(got.QueueUrl), nil
	}
	if _, missing := errors.AsType[*types.QueueDoesNotExist](err); !missing {
		return "", fmt.Errorf("sqs: queue %s: %w", name, err)
	}
	created, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	if err != nil {
		return "", fmt.Errorf("sqs: create queue %s: %w", name, err)
	}
	return aws.ToString(created.QueueUrl), nil
}

func (b *sqsBroker) Name() string { return "SQS queue " + b.queueURL }

// Received reads the queue until it is empty and returns every message read since
// the broker was opened.
func (b *sqsBroker) Received(ctx context.Context) ([]delivery, error) {
	messages, err := b.receive(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range messages {
		d, err := sqstransport.Decode(m)
		if err != nil {
			return nil, err
		}
		idempotencyKey := ""
		for _, h := range d.Headers {
			if h.Key == outbox.HeaderIdempotencyKey {
				idempotencyKey = string(h.Value)
			}
		}
		b.received = append(b.received, delivery{
			Topic: topic, Key: d.Key, Payload: d.Payload,
			ID: d.ID.String(), IdempotencyKey: idempotencyKey,
		})
	}
	return slices.Clone(b.received), nil
}

// receive reads and deletes messages until the queue is empty. Short polls read
// quickly but may miss messages on real SQS, which samples its servers; so the queue
// counts as empty only when a long poll of a second finds nothing too.
func (b *sqsBroker) receive(ctx context.Context) ([]types.Message, error) {
	var read []types.Message
	var wait int32 // seconds; 0 is a short poll
	for {
		out, err := b.client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:              aws.String(b.queueURL),
			MaxNumberOfMessages:   10,
			WaitTimeSeconds:       wait,
			MessageAttributeNames: []string{"All"}, // Decode needs them
		})
		if err != nil {
			return nil, fmt.Errorf("sqs: receive: %w", err)
		}
		if len(out.Messages) == 0 {
			if wait > 0 {
				return read, nil
			}
			wait = 1
			continue
		}
		wait = 0
		read = append(read, out.Messages...)
		var done []types.DeleteMessageBatchRequestEntry
		for i, m := range out.Messages {
			done = append(done, types.DeleteMessageBatchRequestEntry{
				Id: aws.String(fmt.Sprint(i)), ReceiptHandle: m.ReceiptHandle,
			})
		}
		deleted, err := b.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{
			QueueUrl: aws.String(b.queueURL), Entries: done,
		})
		if err != nil {
			return nil, fmt.Errorf("sqs: delete: %w", err)
		}
		if len(deleted.Failed) > 0 {
			return nil, fmt.Errorf("sqs: delete: %s", aws.ToString(deleted.Failed[0].Message))
		}
	}
}

func (b *sqsBroker) Close() error { return nil }
