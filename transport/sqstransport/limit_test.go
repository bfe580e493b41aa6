package sqstransport

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// fill pads msg's payload so that its Size is exactly size: binary bytes (which travel
// as base64, the costliest encoding) or text.
func fill(t testing.TB, msg outbox.Message, size int, binary bool) outbox.Message {
	t.Helper()
	msg.Payload = nil
	n := size - msg.Size()
	require.GreaterOrEqual(t, n, 0, "the message's other parts exceed %d bytes", size)
	if binary {
		msg.Payload = bytes.Repeat([]byte{0xff}, n)
	} else {
		msg.Payload = bytes.Repeat([]byte{'x'}, n)
	}
	require.Equal(t, size, msg.Size())
	return msg
}

func mustEnvelope(t testing.TB, msg outbox.Message) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(msg, 8)
	require.NoError(t, err)
	return env
}

// worstHeaders are coveredHeaders headers that cost SQS the most beyond their own
// bytes: eight with the longest attribute names SQS takes, out of order so that the
// layout repeats every name, and the rest packed with one-byte names and nil values.
func worstHeaders() []outbox.Header {
	var hs []outbox.Header
	for i := range maxNativeHeaders {
		name := strings.Repeat(string(rune('z'-i)), maxAttributeName)
		hs = append(hs, outbox.Header{Key: name, Value: []byte{'v'}})
	}
	for len(hs) < coveredHeaders {
		hs = append(hs, outbox.Header{Key: "p", Value: nil})
	}
	return hs
}

// Transport.MaxMessageSize is a limit on the captured message's Size that SQS can
// always carry: a message exactly at it, whatever its shape (binary payload, key,
// up to 32 headers of the costliest kind), encodes within Config.QueueLimit with the
// attributes the transport adds.
func TestLimitCoversTheCostliestMessages(t *testing.T) {
	t.Parallel()
	for _, queueLimit := range []int{MinQueueLimit, 10_000, DefaultQueueLimit, MaxQueueLimit} {
		for _, omit := range []bool{false, true} {
			tr, err := New(&nopClient{}, Config{QueueLimit: queueLimit, OmitIdempotencyKey: omit})
			require.NoError(t, err)
			limit := tr.MaxMessageSize()
			require.Positive(t, limit)
			shapes := map[string]outbox.Message{
				"payload only":        {Topic: "t"},
				"empty key":           {Topic: "t", Key: []byte{}},
				"binary key":          {Topic: "t", Key: []byte{0, 1, 2}},
				"costliest headers":   {Topic: "t", Key: []byte{}, Headers: worstHeaders()},
				"headers, binary key": {Topic: "t", Key: bytes.Repeat([]byte{0xfe}, 300), Headers: worstHeaders()},
				"own message id":      {Topic: "t", Headers: []outbox.Header{{Key: outbox.HeaderMessageID, Value: nil}, {Key: "b", Value: []byte("1")}, {Key: "a", Value: []byte("2")}}},
				"own idempotency key": {Topic: "t", Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte{0xff}}}},
			}
			for name, shape := range shapes {
				if shape.Size() > limit {
					continue // capture refuses it whatever the payload
				}
				for _, binary := range []bool{true, false} {
					env := mustEnvelope(t, fill(t, shape, limit, binary))
					e, err := encode(env, queueLimit, !omit)
					require.NoError(t, err, "QueueLimit %d, omit %v, %s, binary %v", queueLimit, omit, name, binary)
					assert.LessOrEqual(t, e.size, queueLimit)
				}
			}
		}
	}
}

// The same for random messages: any message of at most 32 headers whose Size is the
// limit encodes within QueueLimit.
func TestLimitCoversRandomMessages(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	randomBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return b
	}
	for _, queueLimit := range []int{MinQueueLimit, DefaultQueueLimit} {
		tr, err := New(&nopClient{}, Config{QueueLimit: queueLimit})
		require.NoError(t, err)
		limit := tr.MaxMessageSize()
		for range 300 {
			msg := outbox.Message{Topic: strings.Repeat("t", 1+rng.IntN(20))}
			switch rng.IntN(4) {
			case 1:
				msg.Key = []byte{}
			case 2:
				msg.Key = randomBytes(1 + rng.IntN(40))
			case 3:
				msg.Key = []byte("customer-42")
			}
			for range rng.IntN(coveredHeaders + 1) {
				var name string
				switch rng.IntN(4) {
				case 0:
					name = strings.Repeat("n", 1+rng.IntN(maxAttributeName))
				case 1:
					name = "h" + string(rune('a'+rng.IntN(26)))
				case 2:
					name = "not an attribute name"
				default:
					name = []string{outbox.HeaderIdempotencyKey, outbox.HeaderMessageID, AttrKey, AttrLayout, AttrHeaders}[rng.IntN(5)]
				}
				var value []byte
				switch rng.IntN(3) {
				case 0:
				case 1:
					value = randomBytes(rng.IntN(30))
				default:
					value = []byte("some text")
				}
				msg.Headers = append(msg.Headers, outbox.Header{Key: name, Value: value})
			}
			if msg.Size() > limit {
				continue
			}
			env := mustEnvelope(t, fill(t, msg, limit, rng.IntN(2) == 0))
			e, err := encode(env, queueLimit, true)
			require.NoError(t, err, "%d headers, key %q", len(msg.Headers), msg.Key)
			require.LessOrEqual(t, e.size, queueLimit)
		}
	}
}

// FuzzLimitHolds: a message of at most 32 headers padded to exactly the limit always
// encodes within QueueLimit.
func FuzzLimitHolds(f *testing.F) {
	f.Add([]byte("key"), []byte("traceparent\xff00-1-2-01\xffx-a\xff\x00"), false, true)
	f.Add([]byte{}, []byte("a b\xffv\xff.bad\xff\xff"), true, false)
	f.Fuzz(func(t *testing.T, key, headerData []byte, nilKey, binary bool) {
		msg := outbox.Message{Topic: "t", Headers: fuzzHeaders(headerData)}
		if !nilKey {
			msg.Key = key
		}
		if len(msg.Headers) > coveredHeaders {
			msg.Headers = msg.Headers[:coveredHeaders]
		}
		limit := limitFor(MinQueueLimit, true)
		if msg.Validate() != nil || msg.Size() > limit {
			return
		}
		msg = fill(t, msg, limit, binary)
		env := &driver.Envelope{Message: msg}
		env.ID = uuid.Must(uuid.NewV7())
		if _, err := encode(env, MinQueueLimit, true); err != nil {
			t.Fatalf("a message at the limit does not encode: %v", err)
		}
	})
}

// A Config.MaxMessageSize under the default is what the transport reports and what
// Publish enforces: a message one byte over it fails permanently, unsent.
func TestLowerMaxMessageSizeIsEnforced(t *testing.T) {
	t.Parallel()
	tr, err := New(&nopClient{}, Config{MaxMessageSize: 1000, Resolver: Queues{"t": "https://sqs.example/q"}})
	require.NoError(t, err)
	require.Equal(t, 1000, tr.MaxMessageSize())
	env := mustEnvelope(t, outbox.Message{Topic: "t", Payload: bytes.Repeat([]byte{'x'}, 1000)})
	err = tr.Publish(context.Background(), []*driver.Envelope{env})
	var perr *driver.PublishError
	require.ErrorAs(t, err, &perr)
	require.Len(t, perr.Failed, 1)
	assert.True(t, driver.IsPermanent(perr.Failed[0].Err))
	assert.ErrorIs(t, perr.Failed[0].Err, outbox.ErrTooLarge)
	assert.ErrorContains(t, perr.Failed[0].Err, "Config.MaxMessageSize")
}
