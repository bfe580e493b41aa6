package tests

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// gate holds every publish until it is opened, and says when the first one waits.
type gate struct {
	*outboxtest.Recorder
	waiting chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{Recorder: outboxtest.NewRecorder(), waiting: make(chan struct{}), open: make(chan struct{})}
}

func (g *gate) Publish(ctx context.Context, batch []*driver.Envelope) error {
	g.once.Do(func() { close(g.waiting) })
	select {
	case <-g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Recorder.Publish(ctx, batch)
}

// TestInvocationsInTwoEnvironmentsDoNotTakeTurns: while one execution environment's
// invocation dispatches a bucket, another environment's invocation naming a later
// message of the same bucket returns at once, with nothing published and nothing
// reported failed; the first publishes only what its own event named, and the later
// message waits for the sweep.
func TestInvocationsInTwoEnvironmentsDoNotTakeTurns(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	sa := d.newStore(t, dynamostore.Config{BucketCount: 1})
	sb, err := dynamostore.New(d.client, sa.Config())
	require.NoError(t, err)
	msgs := enqueue(t, sa, []byte("k"), 2)
	var first, second streamOf
	inserts(t, d, sa, &first, msgs[0])
	inserts(t, d, sa, &second, msgs[1])

	pubA := newGate()
	_, ha := newHandler(t, sa, pubA, "lambda-a")
	recB := outboxtest.NewRecorder()
	relayB, hb := newHandler(t, sb, recB, "lambda-b")

	type result struct {
		resp events.DynamoDBEventResponse
		err  error
	}
	doneA := make(chan result, 1)
	go func() {
		resp, err := ha.Handle(context.Background(), first.ev)
		doneA <- result{resp, err}
	}()
	select { // environment a holds the bucket and is publishing
	case <-pubA.waiting:
	case <-time.After(time.Minute):
		t.Fatal("the first invocation never published")
	}

	// Bounded, in case the second invocation waited for the first.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := hb.Handle(ctx, second.ev)
	require.NoError(t, err, "the second invocation returns while the first still publishes")
	assert.Empty(t, resp.BatchItemFailures, "the held bucket's records count as handled")
	assert.Zero(t, recB.Len())

	close(pubA.open)
	a := <-doneA
	require.NoError(t, a.err)
	assert.Empty(t, a.resp.BatchItemFailures)
	assert.Equal(t, payloads(msgs[:1]), payloads(pubA.Messages()), "the holder drains up to what its own event named")
	assert.Equal(t, []string{fmt.Sprintf("%019d", msgs[1].Seq)}, keysOf(t, d, sa.Config().TableName, "OUTBOX#MESSAGES#0"),
		"the message only the second event named is still pending")

	// The sweep sends it.
	_, err = relayB.RunOnce(context.Background())
	require.NoError(t, err)
	assert.Equal(t, payloads(msgs[1:]), payloads(recB.Messages()))
}
