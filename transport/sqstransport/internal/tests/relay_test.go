package tests

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/internal/transportkit"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

// relayHarness runs the transport under the relay suite. A FIFO queue keeps a key's
// order (one message group per key) and drops a republished message (its
// deduplication id is the message ID); a standard queue does neither.
func relayHarness(fifo bool) relaysuite.Harness {
	rq := &relayQueues{fifo: fifo, urls: map[string]string{}, pending: map[string][]outboxtest.Received{}}
	h := relaysuite.Harness{
		New:  rq.transport,
		Read: rq.read,
		Raw:  rq.raw,
		Features: relaysuite.Features{
			Ordered: fifo, Deduplicates: fifo, Proxy: true, KeepsKeyOrder: fifo, SizeLimiter: true,
			IdempotencyKey: true, HeadersAtLimit: 32,
		},
	}
	// The Consume subtests run on the standard queue only: the emulator hands out a
	// FIFO group's later messages while an earlier one is in flight, which SQS does
	// not.
	if !fifo {
		h.Source, h.Foreign, h.Settled = rq.source, rq.foreign, rq.settled
	}
	return h
}

// fifoKeepsKeyOrder is the transport on a FIFO queue as a key-order keeper, which it
// does not declare (the relay then never puts two messages of a key in one call).
// SQS holds a group's later messages back behind a transient failure; behind a
// permanent one, which the relay parks, it sends them. A key-order keeper must never
// acknowledge them, so Publish reports those failed too: the queue's deduplication
// drops the relay's retry of what was sent.
type fifoKeepsKeyOrder struct{ *sqstransport.Transport }

func (fifoKeepsKeyOrder) KeepsKeyOrder() bool { return true }

func (f fifoKeepsKeyOrder) Publish(ctx context.Context, batch []*driver.Envelope) error {
	err := f.Transport.Publish(ctx, batch)
	var pe *driver.PublishError
	if !errors.As(err, &pe) {
		return err
	}
	errs := make([]error, len(batch))
	for _, m := range pe.Failed {
		errs[slices.IndexFunc(batch, func(env *driver.Envelope) bool { return env.ID == m.ID })] = m.Err
	}
	transportkit.HoldBackTails(batch, errs, errHeldBack)
	held := &driver.PublishError{}
	for i, err := range errs {
		if err != nil {
			held.Failed = append(held.Failed, driver.MessageError{ID: batch[i].ID, Err: err})
		}
	}
	return held
}

var errHeldBack = errors.New("held back behind an earlier message of its key that failed")

// relayQueues gives each topic of the relay suite a queue of its own in the shared
// emulator, FIFO (named after the topic plus ".fifo") when fifo is set.
type relayQueues struct {
	fifo bool

	mu      sync.Mutex
	urls    map[string]string
	pending map[string][]outboxtest.Received
}

func (rq *relayQueues) url(tb testing.TB, topic string) string {
	rq.mu.Lock()
	defer rq.mu.Unlock()
	u, ok := rq.urls[topic]
	if !ok {
		name := topic
		if rq.fifo {
			name += ".fifo"
		}
		u = emulator.Shared(tb).CreateQueue(tb, name, nil)
		rq.urls[topic] = u
	}
	return u
}

// source receives from topic's queue, with a short wait and visibility timeout.
func (rq *relayQueues) source(tb testing.TB, topic string) inbox.Source {
	src, err := sqstransport.NewSource(emulator.Shared(tb).Client(), sqstransport.SourceConfig{
		QueueURL: rq.url(tb, topic), WaitTime: time.Second, VisibilityTimeout: sourceVisibility,
	})
	require.NoError(tb, err)
	return src
}

// foreign sends a message with no outbox attributes.
func (rq *relayQueues) foreign(tb testing.TB, topic string) {
	in := &sqs.SendMessageInput{QueueUrl: aws.String(rq.url(tb, topic)), MessageBody: aws.String("not from the outbox")}
	_, err := emulator.Shared(tb).Client().SendMessage(context.Background(), in)
	require.NoError(tb, err)
}

// sourceVisibility is the visibility timeout of the sources the harness makes.
const sourceVisibility = 5 * time.Second

// settled requires every message the outbox wrote to have been deleted: once the
// source's visibility timeout has passed since the consumer stopped, whatever it
// left is visible again, and receiving everything finds only foreign messages (the
// source leaves those for the queue's redrive policy).
func (rq *relayQueues) settled(tb testing.TB, topic string) {
	url := rq.url(tb, topic)
	client := emulator.Shared(tb).Client()
	visibleAgain := time.Now().Add(sourceVisibility + time.Second)
	for {
		out, err := client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 600,
			MessageAttributeNames: []string{"All"},
		})
		require.NoError(tb, err)
		for _, m := range out.Messages {
			d, err := sqstransport.Decode(m)
			require.Error(tb, err, "message %v, which the outbox wrote, is still on the queue", d)
		}
		if len(out.Messages) == 0 && time.Now().After(visibleAgain) {
			return
		}
	}
}

// transport builds a client of its own: through dial, when it is set, it sends every
// request to the proxy and gives up on one after two seconds.
func (rq *relayQueues) transport(tb testing.TB, topic string, dial func(string) string) driver.Transport {
	srv := emulator.Shared(tb)
	queue := rq.url(tb, topic)
	client := srv.Client()
	if dial != nil {
		u, err := url.Parse(srv.URL)
		require.NoError(tb, err)
		endpoint := "http://" + dial(u.Host)
		client = srv.Client(func(o *sqs.Options) {
			o.BaseEndpoint = aws.String(endpoint)
			o.HTTPClient = awshttp.NewBuildableClient().WithTimeout(2 * time.Second)
		})
	}
	tr, err := sqstransport.New(client, sqstransport.Config{Resolver: sqstransport.Queues{topic: queue}})
	require.NoError(tb, err)
	if rq.fifo {
		return fifoKeepsKeyOrder{tr}
	}
	return tr
}

// read receives n messages; a receive takes up to ten, and what goes past n waits
// for the next read.
func (rq *relayQueues) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	t, ok := tb.(*testing.T)
	require.True(tb, ok, "Read runs in tests only")
	queue := rq.url(tb, topic)
	rq.mu.Lock()
	defer rq.mu.Unlock()
	if more := n - len(rq.pending[topic]); more > 0 {
		got, _ := receive(t, emulator.Shared(tb).Client(), queue, more)
		for _, d := range got {
			rq.pending[topic] = append(rq.pending[topic], outboxtest.Received{ID: d.ID.String(), Topic: topic, Key: d.Key, Payload: d.Payload, Headers: d.Headers})
		}
	}
	out := rq.pending[topic][:n:n]
	rq.pending[topic] = rq.pending[topic][n:]
	return out
}

// raw is rawPublish through the transport's client.
func (rq *relayQueues) raw(tb testing.TB, tr driver.Transport) func(context.Context, []*driver.Envelope) error {
	var client *sqs.Client
	require.True(tb, tr.(*sqstransport.Transport).As(&client))
	return func(ctx context.Context, batch []*driver.Envelope) error {
		return rawPublish(ctx, client, rq.url(tb, batch[0].Topic), batch, sqstransport.DefaultConcurrency)
	}
}

func TestRelayStandardQueue(t *testing.T) {
	t.Parallel()
	relaysuite.Run(t, relayHarness(false))
}

func TestRelayFIFOQueue(t *testing.T) {
	t.Parallel()
	relaysuite.Run(t, relayHarness(true))
}
