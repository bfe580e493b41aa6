//go:build unix

package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// These outages stop the emulator itself (SIGSTOP, or a kill) between two requests of
// one Publish call, and check per request what the transport reports: which messages
// failed, that every one reported sent was acknowledged, and on a FIFO queue that the
// later messages of a failed group are not sent at all. The relay suite
// (relay_test.go) runs connection outages under a relay, where a call's partial
// result is retried before it can be seen; these stay for the single call.

// outage starts an emulator of the test's own with one queue, and a client that gives
// up on a request after a short timeout.
func outage(t *testing.T, fifo bool) (*emulator.Server, *sqs.Client, string) {
	t.Helper()
	srv := emulator.Start(t)
	url := srv.CreateQueue(t, queueName("outage", fifo), nil)
	client := srv.Client(func(o *sqs.Options) {
		o.HTTPClient = awshttp.NewBuildableClient().WithTimeout(2 * time.Second)
	})
	return srv, client, url
}

func batchOf(t *testing.T, n int, key func(i int) []byte) []*driver.Envelope {
	batch := make([]*driver.Envelope, n)
	for i := range batch {
		batch[i] = envelope(t, "t", key(i), []byte(fmt.Sprint("message ", i)))
	}
	return batch
}

// The emulator hangs from the second request on: those requests time out and are
// reported transient, and every message reported sent is in the queue.
func TestOutagePausedMidBatch(t *testing.T) {
	t.Parallel()
	srv, client, url := outage(t, false)
	hook := &hookClient{API: client, before: func(call int) {
		if call == 2 {
			require.NoError(t, srv.Pause())
		}
	}}
	tr := newTransport(t, hook, sqstransport.Config{Resolver: sqstransport.Queues{"t": url}, Concurrency: 1})
	batch := batchOf(t, 30, func(i int) []byte { return []byte(fmt.Sprint(i % 4)) })

	failed := failedIDs(t, tr.Publish(context.Background(), batch))
	require.NoError(t, srv.Resume())
	assert.GreaterOrEqual(t, len(failed), 20, "the requests after the outage began failed")

	inQueue := map[uuid.UUID]bool{}
	for _, d := range drain(t, srv.Client(), url) {
		inQueue[d.ID] = true
	}
	for _, env := range batch {
		if _, ok := failed[env.ID]; !ok {
			assert.True(t, inQueue[env.ID], "message %s reported sent but not in the queue", env.ID)
		}
	}
}

// The emulator dies mid-batch: the requests after it fail transiently (connection
// refused) and only what the emulator acknowledged is reported sent.
func TestOutageKilledMidBatch(t *testing.T) {
	t.Parallel()
	srv, client, url := outage(t, false)
	hook := &hookClient{API: client, before: func(call int) {
		if call == 2 {
			srv.Stop()
		}
	}}
	tr := newTransport(t, hook, sqstransport.Config{Resolver: sqstransport.Queues{"t": url}, Concurrency: 1})
	batch := batchOf(t, 25, func(i int) []byte { return nil })

	failed := failedIDs(t, tr.Publish(context.Background(), batch))
	assert.Len(t, failed, 15)
	for _, env := range batch {
		if _, ok := failed[env.ID]; !ok {
			assert.True(t, hook.acked[env.ID.String()], "message %s reported sent without an acknowledgement", env.ID)
		}
	}
	assert.Len(t, hook.acked, 10)
}

// On a FIFO queue, once a request failed, later messages of its groups are not sent
// at all in this batch, so a retry cannot land behind them.
func TestOutageFIFOHoldsBackLaterMessagesOfAFailedGroup(t *testing.T) {
	t.Parallel()
	srv, client, url := outage(t, true)
	hook := &hookClient{API: client, before: func(call int) {
		if call == 2 {
			require.NoError(t, srv.Pause())
		}
	}}
	tr := newTransport(t, hook, sqstransport.Config{Resolver: sqstransport.Queues{"t": url}})
	// Three keys, ten messages each: every request carries one message per key.
	batch := batchOf(t, 30, func(i int) []byte { return fmt.Appendf(nil, "key-%d", i%3) })

	failed := failedIDs(t, tr.Publish(context.Background(), batch))
	require.NoError(t, srv.Resume())
	assert.Len(t, failed, 27)
	assert.EqualValues(t, 2, hook.calls.Load(), "after the second request failed, every later message belonged to a failed group and was not sent")
	for _, env := range batch[6:] {
		assert.ErrorContains(t, failed[env.ID], "held back")
	}
	got := drain(t, srv.Client(), url)
	require.GreaterOrEqual(t, len(got), 3)
	require.LessOrEqual(t, len(got), 6, "nothing held back reached the queue")
	for i, d := range got {
		assert.Equal(t, batch[i].ID, d.ID, "group order")
	}
}
