package tests

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	emulator "github.com/outboxkit/outbox/internal/sqsemulator"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/sqstransport"
)

func TestMain(m *testing.M) {
	code := m.Run()
	emulator.StopShared()
	os.Exit(code)
}

var queueSeq atomic.Int64

// queueName returns a queue name unique within the test binary.
func queueName(prefix string, fifo bool) string {
	name := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e9, queueSeq.Add(1))
	if fifo {
		name += ".fifo"
	}
	return name
}

// setup starts (or reuses) the emulator and creates one queue of the given kind.
func setup(t *testing.T, fifo bool, attrs map[string]string) (*emulator.Server, string, string) {
	t.Helper()
	srv := emulator.Shared(t)
	name := queueName(strings.ReplaceAll(t.Name(), "/", "-")[:min(40, len(t.Name()))], fifo)
	name = strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
			return r
		}
		return '_'
	}, name)
	return srv, name, srv.CreateQueue(t, name, attrs)
}

func newTransport(t *testing.T, client sqstransport.API, cfg sqstransport.Config) *sqstransport.Transport {
	t.Helper()
	tr, err := sqstransport.New(client, cfg)
	require.NoError(t, err)
	return tr
}

func envelope(t *testing.T, topic string, key, payload []byte, headers ...outbox.Header) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: key, Payload: payload, Headers: headers}, 8)
	require.NoError(t, err)
	return env
}

// receive reads n messages from a queue, decoding each, in arrival order.
func receive(t *testing.T, client *sqs.Client, url string, n int) ([]*sqstransport.Delivery, []types.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var (
		out []*sqstransport.Delivery
		raw []types.Message
	)
	for len(out) < n {
		res, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(url),
			MaxNumberOfMessages:         10,
			WaitTimeSeconds:             1,
			VisibilityTimeout:           600,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
			// The emulator reads system attributes only from the deprecated field.
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameAll}, //lint:ignore SA1019 the emulator needs it
		})
		require.NoError(t, err, "received %d of %d", len(out), n)
		for _, m := range res.Messages {
			d, err := sqstransport.Decode(m)
			require.NoError(t, err)
			out = append(out, d)
			raw = append(raw, m)
		}
	}
	return out, raw
}

// drain reads whatever the queue holds within a short wait.
func drain(t *testing.T, client *sqs.Client, url string) []*sqstransport.Delivery {
	t.Helper()
	var out []*sqstransport.Delivery
	for {
		res, err := client.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl:              aws.String(url),
			MaxNumberOfMessages:   10,
			WaitTimeSeconds:       1,
			VisibilityTimeout:     600,
			MessageAttributeNames: []string{"All"},
		})
		require.NoError(t, err)
		if len(res.Messages) == 0 {
			return out
		}
		for _, m := range res.Messages {
			d, err := sqstransport.Decode(m)
			require.NoError(t, err)
			out = append(out, d)
		}
	}
}

// published is what a consumer sees: the application's headers, then an
// idempotency key when the application set none, then the message ID.
func published(env *driver.Envelope) []outbox.Header {
	id := []byte(env.ID.String())
	hs := append([]outbox.Header{}, env.Headers...)
	if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
		hs = append(hs, outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: id})
	}
	return append(hs, outbox.Header{Key: outbox.HeaderMessageID, Value: id})
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

func TestPublishRoundTripStandard(t *testing.T) {
	t.Parallel()
	srv, name, url := setup(t, false, nil)
	client := srv.Client()
	tr := newTransport(t, client, sqstransport.Config{}) // default name resolver

	var many []outbox.Header
	for i := range 14 {
		many = append(many, outbox.Header{Key: fmt.Sprintf("h-%02d", 13-i), Value: []byte(fmt.Sprint("v", i))})
	}
	many = append(many, outbox.Header{Key: "h-00", Value: []byte("duplicate name")}, outbox.Header{Key: "empty", Value: []byte{}})
	batch := []*driver.Envelope{
		envelope(t, name, []byte("k1"), []byte(`{"text":"plain"}`), outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte("idem-1")}),
		envelope(t, name, nil, randomBytes(1024)),
		envelope(t, name, randomBytes(16), []byte("binary key")),
		envelope(t, name, []byte{}, []byte("empty key")),
		envelope(t, name, []byte("tomb"), nil),
		envelope(t, name, []byte("empty"), []byte{}),
		envelope(t, name, []byte("many"), []byte("many headers"), many...),
		envelope(t, name, []byte("bin-header"), []byte("x"), outbox.Header{Key: "trace", Value: []byte{0, 1, 2, 0xff}}),
	}
	for i := range 14 { // past one request of ten
		batch = append(batch, envelope(t, name, []byte(fmt.Sprint("key-", i%3)), []byte(fmt.Sprint("filler ", i))))
	}
	require.NoError(t, tr.Publish(context.Background(), batch))

	got, _ := receive(t, client, url, len(batch))
	byID := make(map[uuid.UUID]*sqstransport.Delivery, len(got))
	for _, d := range got {
		byID[d.ID] = d
	}
	require.Len(t, byID, len(batch))
	for _, env := range batch {
		d := byID[env.ID]
		require.NotNil(t, d, "message %s missing", env.ID)
		assert.Equal(t, env.Key, d.Key, "key of %s", env.ID)
		assert.Equal(t, env.Payload, d.Payload, "payload of %s", env.ID)
		assert.Equal(t, published(env), d.Headers, "headers of %s", env.ID)
	}
}

func TestPublishFIFOKeepsGroupOrder(t *testing.T) {
	t.Parallel()
	srv, _, url := setup(t, true, nil)
	client := srv.Client()
	tr := newTransport(t, client, sqstransport.Config{Resolver: sqstransport.Queues{"orders": url}})

	var batch []*driver.Envelope
	keys := [][]byte{[]byte("alpha"), []byte("with space"), nil}
	for i := range 36 {
		batch = append(batch, envelope(t, "orders", keys[i%3], []byte(fmt.Sprint(i))))
	}
	require.NoError(t, tr.Publish(context.Background(), batch))

	got, raw := receive(t, client, url, len(batch))
	next := map[string]int{}
	for i, d := range got {
		env := batch[mustIndex(t, batch, d.ID)]
		group := sqstransport.GroupID(env)
		assert.Equal(t, group, raw[i].Attributes["MessageGroupId"])
		assert.Equal(t, env.ID.String(), raw[i].Attributes["MessageDeduplicationId"])
		seq := mustIndex(t, batch, d.ID)
		assert.Greater(t, seq+1, next[group], "group %s out of order", group)
		next[group] = seq + 1
	}

	// The deduplication ID is the message ID: publishing again adds nothing.
	require.NoError(t, tr.Publish(context.Background(), batch[:5]))
	assert.Empty(t, drain(t, client, url))
}

func mustIndex(t *testing.T, batch []*driver.Envelope, id uuid.UUID) int {
	t.Helper()
	for i, env := range batch {
		if env.ID == id {
			return i
		}
	}
	t.Fatalf("unknown message %s", id)
	return -1
}

// A queue whose MaximumMessageSize is below the transport's limit: SQS itself
// refuses the entry, and that per-entry failure is permanent while its neighbours in
// the same request are sent.
func TestPublishEntryRefusedBySQSIsPermanent(t *testing.T) {
	t.Parallel()
	srv, _, url := setup(t, false, map[string]string{"MaximumMessageSize": "1024"})
	client := srv.Client()
	tr := newTransport(t, client, sqstransport.Config{Resolver: sqstransport.Queues{"t": url}})
	big := envelope(t, "t", nil, bytes.Repeat([]byte("y"), 2000))
	small := envelope(t, "t", nil, []byte("small"))

	err := tr.Publish(context.Background(), []*driver.Envelope{big, small})
	var perr *driver.PublishError
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, 1)
	assert.Equal(t, big.ID, perr.Failed[0].ID)
	assert.True(t, driver.IsPermanent(perr.Failed[0].Err), "%v", perr.Failed[0].Err)
	var entry *sqstransport.EntryError
	require.ErrorAs(t, perr.Failed[0].Err, &entry)
	assert.True(t, entry.SenderFault)

	got, _ := receive(t, client, url, 1)
	assert.Equal(t, small.ID, got[0].ID)
}

func TestPublishUnknownQueueIsPermanent(t *testing.T) {
	t.Parallel()
	srv := emulator.Shared(t)
	client := srv.Client()

	// By name: GetQueueUrl says the queue does not exist.
	tr := newTransport(t, client, sqstransport.Config{})
	env := envelope(t, "no-such-queue", nil, []byte("x"))
	err := tr.Publish(context.Background(), []*driver.Envelope{env})
	var perr *driver.PublishError
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, 1)
	assert.True(t, driver.IsPermanent(perr.Failed[0].Err), "%v", perr.Failed[0].Err)

	// By URL: SendMessageBatch says so.
	tr = newTransport(t, client, sqstransport.Config{Resolver: sqstransport.Queues{"t": srv.URL + "/123456789012/no-such-queue"}})
	err = tr.Publish(context.Background(), []*driver.Envelope{envelope(t, "t", nil, []byte("x")), envelope(t, "t", nil, []byte("y"))})
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, 2)
	for _, f := range perr.Failed {
		assert.True(t, driver.IsPermanent(f.Err), "%v", f.Err)
	}

	// A topic missing from a static map.
	err = tr.Publish(context.Background(), []*driver.Envelope{envelope(t, "unmapped", nil, []byte("x"))})
	require.ErrorAs(t, err, &perr)
	assert.ErrorIs(t, perr.Failed[0].Err, middleware.ErrNoRoute)
	assert.True(t, driver.IsPermanent(perr.Failed[0].Err))
}

func TestPublishCancelledContext(t *testing.T) {
	t.Parallel()
	srv, name, _ := setup(t, false, nil)
	tr := newTransport(t, srv.Client(), sqstransport.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := tr.Publish(ctx, []*driver.Envelope{envelope(t, name, nil, []byte("x"))})
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, context.Canceled, err, "context errors are returned unwrapped")
}

// hookClient runs before on every SendMessageBatch call (numbered from 1) and records
// every message ID the emulator acknowledged.
type hookClient struct {
	sqstransport.API
	before func(call int)
	calls  atomic.Int32

	mu    sync.Mutex
	acked map[string]bool
}

func (h *hookClient) SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error) {
	if h.before != nil {
		h.before(int(h.calls.Add(1)))
	}
	out, err := h.API.SendMessageBatch(ctx, in, opts...)
	if err == nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.acked == nil {
			h.acked = map[string]bool{}
		}
		for _, s := range out.Successful {
			for _, e := range in.Entries {
				if *e.Id == *s.Id {
					h.acked[*e.MessageAttributes[sqstransport.AttrMessageID].StringValue] = true
				}
			}
		}
	}
	return out, err
}

// failedIDs checks that every failure is transient and returns the failed IDs.
func failedIDs(t *testing.T, err error) map[uuid.UUID]error {
	t.Helper()
	failed := outboxtest.Failures(t, err)
	for _, cause := range failed {
		assert.False(t, driver.IsPermanent(cause), "an outage is transient: %v", cause)
	}
	return failed
}

// countingClient counts GetQueueUrl calls on the way to the real client.
type countingClient struct {
	sqstransport.API
	lookups atomic.Int32
}

func (c *countingClient) GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, opts ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error) {
	c.lookups.Add(1)
	return c.API.GetQueueUrl(ctx, in, opts...)
}

func TestNameResolverCachesLookups(t *testing.T) {
	t.Parallel()
	srv, name, url := setup(t, false, nil)
	client := &countingClient{API: srv.Client()}
	resolver := sqstransport.NewNameResolver(client, "")
	tr := newTransport(t, client, sqstransport.Config{Resolver: resolver})
	for i := range 3 {
		require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{envelope(t, name, nil, []byte(fmt.Sprint(i)))}))
	}
	assert.EqualValues(t, 1, client.lookups.Load(), "one GetQueueUrl per topic")
	got, err := resolver.QueueURL(context.Background(), name)
	require.NoError(t, err)
	assert.Equal(t, url, got)

	// Failed look-ups are not cached, and a name SQS cannot have is refused locally.
	_, err = resolver.QueueURL(context.Background(), "missing-queue")
	require.True(t, driver.IsPermanent(err), "%v", err)
	_, err = resolver.QueueURL(context.Background(), "missing-queue")
	require.Error(t, err)
	assert.EqualValues(t, 3, client.lookups.Load())
	_, err = resolver.QueueURL(context.Background(), "not a queue name")
	require.ErrorIs(t, err, middleware.ErrNoRoute)
	assert.EqualValues(t, 3, client.lookups.Load())
}
