package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// failingDeletes fails the first n DeleteMessageBatch calls on the real client,
// as a crash between the commit and the delete would leave the messages.
type failingDeletes struct {
	*sqs.Client
	left atomic.Int64
}

func (f *failingDeletes) DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error) {
	if f.left.Add(-1) >= 0 {
		return nil, errors.New("injected: delete lost")
	}
	return f.Client.DeleteMessageBatch(ctx, in, opts...)
}

// newConsumer builds the inbox's consume loop on a source over client.
func newConsumer(t *testing.T, client sqstransport.ReceiveAPI, src sqstransport.SourceConfig, in *inbox.Inbox, handle inbox.Handler, cfg inbox.ConsumerConfig) *inbox.Consumer {
	t.Helper()
	s, err := sqstransport.NewSource(client, src)
	require.NoError(t, err)
	c, err := inbox.NewConsumer(s, in, handle, cfg)
	require.NoError(t, err)
	return c
}

func TestConsumerAppliesOnceInGroupOrderAndDeletesAfterCommit(t *testing.T) {
	srv, _, url := setup(t, true, nil)
	const n, keys = 30, 4
	tr := newTransport(t, srv.Client(), sqstransport.Config{Resolver: sqstransport.Queues{"orders": url}})
	want := map[string][]string{}
	var envs []*driver.Envelope
	for i := range n {
		key := fmt.Sprintf("key-%d", i%keys)
		envs = append(envs, envelope(t, "orders", []byte(key), []byte(fmt.Sprint(i))))
		want[key] = append(want[key], fmt.Sprint(i))
	}
	require.NoError(t, tr.Publish(context.Background(), envs))

	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	defer store.Close()
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	require.NoError(t, err)
	l := outboxtest.NewLedger()
	var processed, dups atomic.Int64
	// The first delete is lost: its messages come back after the visibility timeout
	// and are found duplicates.
	client := &failingDeletes{Client: srv.Client()}
	client.left.Store(1)
	c := newConsumer(t, client, sqstransport.SourceConfig{QueueURL: url, WaitTime: time.Second, VisibilityTimeout: time.Second}, in, l.Apply, inbox.ConsumerConfig{
		Processed: func(_ *inbox.Delivery, res inbox.Result) {
			processed.Add(1)
			if res.Duplicate {
				dups.Add(1)
			}
		},
	})
	stop := outboxtest.RunConsumer(t, c)
	require.Eventually(t, func() bool { return processed.Load()-dups.Load() >= n && dups.Load() > 0 }, time.Minute, 20*time.Millisecond,
		"every message applied, and the lost delete's messages redelivered as duplicates")
	// Wait until the queue is empty: everything was deleted in the end.
	require.Eventually(t, func() bool {
		attrs, err := srv.Client().GetQueueAttributes(context.Background(), &sqs.GetQueueAttributesInput{QueueUrl: &url, AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}})
		require.NoError(t, err)
		return attrs.Attributes["ApproximateNumberOfMessages"] == "0" && attrs.Attributes["ApproximateNumberOfMessagesNotVisible"] == "0"
	}, time.Minute, 100*time.Millisecond)
	require.NoError(t, stop())

	require.Equal(t, want, l.RequireOnce(t, n), "each group's messages were applied in send order")
}

func TestConsumerLeavesFailedMessageForRedelivery(t *testing.T) {
	srv, _, url := setup(t, false, nil)
	tr := newTransport(t, srv.Client(), sqstransport.Config{Resolver: sqstransport.Queues{"orders": url}})
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{envelope(t, "orders", []byte("k"), []byte("v"))}))
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	defer store.Close()
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	require.NoError(t, err)
	l := outboxtest.NewLedger()
	var calls, processed atomic.Int64
	var redelivered sync.Map // the Redelivered values the handler saw
	c := newConsumer(t, srv.Client(), sqstransport.SourceConfig{QueueURL: url, WaitTime: time.Second, VisibilityTimeout: time.Second}, in, func(ctx context.Context, d *inbox.Delivery) error {
		redelivered.Store(d.Redelivered, true)
		if err := l.Apply(ctx, d); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("transient") // rolls the effect back
		}
		return nil
	}, inbox.ConsumerConfig{Processed: func(*inbox.Delivery, inbox.Result) { processed.Add(1) }})
	stop := outboxtest.RunConsumer(t, c)
	require.Eventually(t, func() bool { return processed.Load() == 1 }, time.Minute, 20*time.Millisecond)
	require.NoError(t, stop())
	// Twice at least: a slow machine may also outlast the 1 s visibility timeout.
	require.GreaterOrEqual(t, calls.Load(), int64(2), "the failed message was received again")
	_, first := redelivered.Load(false)
	_, again := redelivered.Load(true)
	require.True(t, first && again, "the queue's receive count tells the first receive from the next")
	l.RequireOnce(t, 1)
}

func TestSourceConfigValidate(t *testing.T) {
	for field, cfg := range map[string]sqstransport.SourceConfig{
		"QueueURL":          {},
		"MaxMessages":       {QueueURL: "q", MaxMessages: 11},
		"WaitTime":          {QueueURL: "q", WaitTime: 21 * time.Second},
		"VisibilityTimeout": {QueueURL: "q", VisibilityTimeout: -1},
	} {
		_, err := sqstransport.NewSource(&sqs.Client{}, cfg)
		require.ErrorIs(t, err, outbox.ErrMisconfigured, field)
		require.ErrorContains(t, err, "SourceConfig."+field)
	}
	_, err := sqstransport.NewSource(nil, sqstransport.SourceConfig{QueueURL: "q"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = sqstransport.NewSource(&sqs.Client{}, sqstransport.SourceConfig{QueueURL: "q"})
	require.NoError(t, err)
}
