package tests

import (
	"context"
	"net/url"
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
		// On FIFO queues the transport comes wrapped in fifoKeepsKeyOrder, which
		// keeps Publish alone of its methods.
		Features: relaysuite.Features{Ordered: fifo, Deduplicates: fifo, Proxy: true, KeepsKeyOrder: fifo, SizeLimiter: !fifo},
	}
	// The Consume subtest runs on the standard queue only: the emulator hands out a
	// FIFO group's later messages while an earlier one is in flight, which SQS does
	// not. A foreign message stays on the queue for its redrive policy, so the
	// harness has no Settled.
	if !fifo {
		h.Source, h.Foreign = rq.source, rq.foreign
	}
	return h
}

// fifoKeepsKeyOrder declares what the transport does on FIFO queues: it never
// acknowledges a key's message after failing an earlier one in the same call (it
// holds back the later messages of a failed group).
type fifoKeepsKeyOrder struct{ driver.Transport }

func (fifoKeepsKeyOrder) KeepsKeyOrder() bool { return true }

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
		QueueURL: rq.url(tb, topic), WaitTime: time.Second, VisibilityTimeout: 5 * time.Second,
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
