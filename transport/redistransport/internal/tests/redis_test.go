package tests

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/netfault"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// A topic whose key holds another type fails permanently, naming the fix; other
// topics of the batch are appended.
func TestWrongTypeIsPermanent(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	taken := streamKey(t, client, "string")
	require.NoError(t, client.Set(t.Context(), taken, "not a stream", 0).Err())
	good := streamKey(t, client, "good")
	tr := newTransport(t, client, redistransport.Config{})
	bad := envelope(t, outbox.Message{Topic: taken, Key: []byte("k"), Payload: []byte("x")})
	ok := envelope(t, outbox.Message{Topic: good, Key: []byte("other"), Payload: []byte("y")})

	failed := outboxtest.Failures(t, tr.Publish(t.Context(), []*driver.Envelope{bad, ok}))
	require.Len(t, failed, 1)
	assert.True(t, driver.IsPermanent(failed[bad.ID]), "%v", failed[bad.ID])
	assert.ErrorIs(t, failed[bad.ID], outbox.ErrMisconfigured)
	assert.ErrorContains(t, failed[bad.ID], "WRONGTYPE")
	assert.Equal(t, int64(1), length(t, client, good))
}

// A refused entry holds back its key's later entries in the batch (transient), so the
// dispatcher retries them after it.
func TestFailureHoldsBackTheKeysLaterEntries(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	taken := streamKey(t, client, "string")
	require.NoError(t, client.Set(t.Context(), taken, "not a stream", 0).Err())
	good := streamKey(t, client, "good")
	tr := newTransport(t, client, redistransport.Config{})
	first := envelope(t, outbox.Message{Topic: taken, Key: []byte("k"), Payload: []byte("1")})
	second := envelope(t, outbox.Message{Topic: good, Key: []byte("k"), Payload: []byte("2")})
	other := envelope(t, outbox.Message{Topic: good, Key: []byte("j"), Payload: []byte("3")})

	failed := outboxtest.Failures(t, tr.Publish(t.Context(), []*driver.Envelope{first, second, other}))
	require.Len(t, failed, 2)
	assert.True(t, driver.IsPermanent(failed[first.ID]))
	assert.False(t, driver.IsPermanent(failed[second.ID]))
	assert.ErrorContains(t, failed[second.ID], "earlier message of its key")
}

// WAIT for a replica this server does not have: the entries are on the primary, but
// reported failed, transient, saying why.
func TestWaitReplicasUnmet(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	replicas, err := client.Info(t.Context(), "replication").Result()
	require.NoError(t, err)
	if !strings.Contains(replicas, "connected_slaves:0") {
		t.Skip("the server has replicas; this test needs one without")
	}
	stream := streamKey(t, client, "wait")
	tr := newTransport(t, client, redistransport.Config{WaitReplicas: 1, WaitTimeout: 50 * time.Millisecond})
	env := envelope(t, outbox.Message{Topic: stream, Key: []byte("k"), Payload: []byte("x")})

	failed := outboxtest.Failures(t, tr.Publish(t.Context(), []*driver.Envelope{env}))
	require.Contains(t, failed, env.ID)
	assert.False(t, driver.IsPermanent(failed[env.ID]))
	assert.ErrorContains(t, failed[env.ID], "only 0 of 1 replicas")
	assert.Equal(t, int64(1), length(t, client, stream), "the entry is on the primary")
}

// MAXLEN ~ n keeps the stream near n entries.
func TestMaxLenTrims(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	stream := streamKey(t, client, "trim")
	tr := newTransport(t, client, redistransport.Config{MaxLen: 100})
	for round := range 10 {
		batch := make([]*driver.Envelope, 200)
		for i := range batch {
			batch[i] = envelope(t, outbox.Message{Topic: stream, Payload: fmt.Appendf(nil, "%d/%d", round, i)})
		}
		require.NoError(t, tr.Publish(t.Context(), batch))
	}
	n := length(t, client, stream)
	assert.GreaterOrEqual(t, n, int64(100), "approximate trimming keeps at least MaxLen")
	assert.Less(t, n, int64(2000), "and trims: 2000 were appended")
}

// A stream mapping appends to the mapped key; Decode returns the topic.
func TestStreamMapping(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	prefix := streamKey(t, client, "events")
	stream := prefix + ":order-placed"
	t.Cleanup(func() { deleteKeys(client, stream) })
	tr := newTransport(t, client, redistransport.Config{Stream: func(topic string) string { return prefix + ":" + topic }})
	env := envelope(t, outbox.Message{Topic: "order-placed", Key: []byte("order-7"), Payload: []byte("p")})
	require.NoError(t, tr.Publish(t.Context(), []*driver.Envelope{env}))
	d := newReader(client, stream).read(t, 1)[0]
	assert.Equal(t, "order-placed", d.Topic)
	assert.Equal(t, stream, d.Stream)
	assert.Equal(t, env.ID, d.ID)
	assert.WithinDuration(t, time.Now(), d.Timestamp, time.Minute)

	var got *redis.Client
	require.True(t, tr.As(&got))
	assert.Same(t, client, got)
}

// A call during a cut appends nothing: go-redis buffers nothing for a connection it
// lost (the relay suite's Outage/Call allows a client that delivers a failed call's
// messages later, and checks Ping); the retry once the proxy heals appends them once.
func TestCallDuringACutAppendsNothing(t *testing.T) {
	t.Parallel()
	direct := connect(t, redisAddr())
	stream := streamKey(t, direct, "outage")
	p := netfault.New(t, redisAddr())
	tr := newTransport(t, connect(t, p.Addr()), redistransport.Config{})
	batch := func() []*driver.Envelope {
		out := make([]*driver.Envelope, 10)
		for i := range out {
			out[i] = envelope(t, outbox.Message{Topic: stream, Key: fmt.Appendf(nil, "k%d", i%3), Payload: fmt.Appendf(nil, "%d", i)})
		}
		return out
	}
	require.NoError(t, tr.Publish(t.Context(), batch()))

	p.Cut()
	cut := batch()
	failed := outboxtest.Failures(t, tr.Publish(t.Context(), cut))
	assert.Len(t, failed, len(cut), "nothing is acknowledged while cut off")
	assert.Equal(t, int64(10), length(t, direct, stream), "nothing is appended while cut off")

	p.Restore()
	require.NoError(t, tr.Publish(t.Context(), cut), "the retry after the outage")
	assert.Equal(t, int64(20), length(t, direct, stream))
}
