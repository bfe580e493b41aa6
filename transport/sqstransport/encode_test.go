package sqstransport

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// roundTrip encodes env and decodes the message SQS would deliver for it.
func roundTrip(t *testing.T, env *driver.Envelope) (encoded, *Delivery) {
	t.Helper()
	e, err := encode(env, MaxQueueLimit, false)
	require.NoError(t, err)
	require.LessOrEqual(t, len(e.attrs), maxAttributes, "SQS allows at most 10 attributes")
	require.NotEmpty(t, e.body, "SQS refuses an empty body")
	require.True(t, validText([]byte(e.body)), "body must be valid SQS text")
	for name, a := range e.attrs {
		require.True(t, validAttributeName(name), "attribute name %q", name)
		if a.StringValue != nil {
			require.NotEmpty(t, *a.StringValue, "attribute %q", name)
			require.True(t, validText([]byte(*a.StringValue)), "attribute %q", name)
		} else {
			require.NotEmpty(t, a.BinaryValue, "attribute %q", name)
		}
	}
	body := e.body
	d, err := Decode(types.Message{Body: &body, MessageAttributes: e.attrs})
	require.NoError(t, err)
	return e, d
}

func newEnvelope(t *testing.T, key, payload []byte, headers ...outbox.Header) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: key, Payload: payload, Headers: headers}, 8)
	require.NoError(t, err)
	return env
}

func withID(env *driver.Envelope) []outbox.Header {
	return append(append([]outbox.Header{}, env.Headers...), outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(env.ID.String())})
}

func TestEncodeRoundTrip(t *testing.T) {
	t.Parallel()
	binary := []byte{0, 1, 2, 0xff, 0xfe, 'a'}
	cases := map[string]struct {
		key, payload []byte
		headers      []outbox.Header
	}{
		"text":            {key: []byte("customer-1"), payload: []byte(`{"a":1}`)},
		"keyless":         {payload: []byte("x")},
		"empty key":       {key: []byte{}, payload: []byte("x")},
		"binary key":      {key: binary, payload: []byte("x")},
		"binary payload":  {payload: binary},
		"invalid utf8":    {payload: []byte{'a', 0xc3}},
		"control char":    {payload: []byte("a\x01b")},
		"U+FFFE":          {payload: []byte("a\uFFFEb")},
		"tombstone":       {key: []byte("k")},
		"empty payload":   {key: []byte("k"), payload: []byte{}},
		"unicode":         {payload: []byte("grüße \U0001F600\t\r\n")},
		"payload is dash": {payload: []byte("-")},
		"one header": {payload: []byte("x"), headers: []outbox.Header{
			{Key: "idempotency-key", Value: []byte("abc")},
		}},
		"order kept": {payload: []byte("x"), headers: []outbox.Header{
			{Key: "zeta", Value: []byte("1")}, {Key: "alpha", Value: []byte("2")},
		}},
		"awkward headers": {payload: []byte("x"), headers: []outbox.Header{
			{Key: "dup", Value: []byte("1")},
			{Key: "empty", Value: []byte{}},
			{Key: "nil", Value: nil},
			{Key: "dup", Value: []byte("2")},
			{Key: "AWS.reserved", Value: []byte("v")},
			{Key: "has space", Value: []byte("v")},
			{Key: "x-outbox-key", Value: []byte("not the key")},
			{Key: "bin", Value: binary},
			{Key: "ünïcode", Value: []byte("v")},
			{Key: "a..b", Value: []byte("v")},
		}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			env := newEnvelope(t, c.key, c.payload, c.headers...)
			_, d := roundTrip(t, env)
			assert.Equal(t, env.ID, d.ID)
			assert.Equal(t, c.key, d.Key)
			assert.Equal(t, c.payload, d.Payload)
			assert.Equal(t, withID(env), d.Headers)
		})
	}
}

func TestEncodeManyHeadersPacksTheRest(t *testing.T) {
	t.Parallel()
	var hs []outbox.Header
	for i := range 25 {
		hs = append(hs, outbox.Header{Key: fmt.Sprintf("h%02d", 24-i), Value: []byte(fmt.Sprint(i))})
	}
	env := newEnvelope(t, []byte("k"), []byte("x"), hs...)
	e, d := roundTrip(t, env)
	assert.Len(t, e.attrs, maxAttributes, "all ten slots used")
	assert.Contains(t, e.attrs, AttrHeaders)
	assert.Contains(t, e.attrs, AttrLayout)
	assert.Contains(t, e.attrs, "h24", "the first headers travel as attributes of their own")
	assert.Equal(t, withID(env), d.Headers)
}

func TestEncodeAttributesForTypicalMessage(t *testing.T) {
	t.Parallel()
	env := newEnvelope(t, []byte("k"), []byte("x"), outbox.Header{Key: "idempotency-key", Value: []byte("abc")})
	e, _ := roundTrip(t, env)
	// Default order (attributes by name, then the message ID) already restores it,
	// so no layout attribute is needed.
	assert.NotContains(t, e.attrs, AttrLayout)
	assert.Equal(t, "abc", *e.attrs["idempotency-key"].StringValue)
	assert.Equal(t, "k", *e.attrs[AttrKey].StringValue)
	assert.Equal(t, env.ID.String(), *e.attrs[AttrMessageID].StringValue)
	want := len("x") + len(AttrMessageID) + 6 + 36 + len(AttrKey) + 6 + 1 + len("idempotency-key") + 6 + 3
	assert.Equal(t, want, e.size)
}

func TestEncodeMessageIDHeaderKeepsItsPlace(t *testing.T) {
	t.Parallel()
	env := newEnvelope(t, nil, []byte("x"),
		outbox.Header{Key: outbox.HeaderMessageID, Value: []byte("stale")},
		outbox.Header{Key: "a", Value: []byte("1")},
	)
	_, d := roundTrip(t, env)
	assert.Equal(t, []outbox.Header{
		{Key: outbox.HeaderMessageID, Value: []byte(env.ID.String())},
		{Key: "a", Value: []byte("1")},
	}, d.Headers)
}

func TestEncodeStampsIdempotencyKey(t *testing.T) {
	t.Parallel()
	env := newEnvelope(t, nil, []byte("x"), outbox.Header{Key: "a", Value: []byte("1")})
	e, err := encode(env, MaxQueueLimit, true)
	require.NoError(t, err)
	assert.NotContains(t, e.attrs, AttrLayout, "the stamped key sits where a decoder expects it")
	body := e.body
	d, err := Decode(types.Message{Body: &body, MessageAttributes: e.attrs})
	require.NoError(t, err)
	assert.Equal(t, []outbox.Header{
		{Key: "a", Value: []byte("1")},
		{Key: outbox.HeaderIdempotencyKey, Value: []byte(env.ID.String())},
		{Key: outbox.HeaderMessageID, Value: []byte(env.ID.String())},
	}, d.Headers)

	// An application's own key is kept as it is.
	env = newEnvelope(t, nil, []byte("x"), outbox.Header{Key: outbox.HeaderIdempotencyKey, Value: []byte("mine")})
	e, err = encode(env, MaxQueueLimit, true)
	require.NoError(t, err)
	assert.Equal(t, "mine", *e.attrs[outbox.HeaderIdempotencyKey].StringValue)
}

func TestEncodeSizeCountsBinaryAndBase64(t *testing.T) {
	t.Parallel()
	env := newEnvelope(t, nil, bytes.Repeat([]byte{0xff}, 300))
	e, err := encode(env, MaxQueueLimit, false)
	require.NoError(t, err)
	assert.Equal(t, 400+len(AttrMessageID)+typeLen+uuidText+len(AttrLayout)+typeLen+len(layoutBodyBase64), e.size)

	_, err = encode(env, 400, false)
	require.ErrorIs(t, err, outbox.ErrTooLarge)
}

func TestDecodeRejectsForeignMessages(t *testing.T) {
	t.Parallel()
	body := "hello"
	_, err := Decode(types.Message{Body: &body})
	require.ErrorContains(t, err, "MessageAttributeNames")

	id := uuid.NewString()
	attrs := map[string]types.MessageAttributeValue{
		AttrMessageID: stringAttr(id),
		AttrLayout:    stringAttr("headers=missing," + AttrMessageID),
	}
	_, err = Decode(types.Message{Body: &body, MessageAttributes: attrs})
	require.ErrorContains(t, err, "missing")

	attrs[AttrLayout] = stringAttr("")
	attrs[AttrHeaders] = types.MessageAttributeValue{DataType: &[]string{"Binary"}[0], BinaryValue: []byte{9}}
	_, err = Decode(types.Message{Body: &body, MessageAttributes: attrs})
	require.ErrorIs(t, err, driver.ErrCorrupt)
}

func TestGroupID(t *testing.T) {
	t.Parallel()
	env := func(key []byte) *driver.Envelope {
		e := newEnvelope(t, key, []byte("x"))
		return e
	}
	keyless := env(nil)
	assert.Equal(t, fmt.Sprintf("bucket:%d", keyless.Bucket), GroupID(keyless))
	assert.Equal(t, "order-42!~", GroupID(env([]byte("order-42!~"))))
	assert.Equal(t, "b64:", GroupID(env([]byte{})))
	assert.Equal(t, "b64:aGFzIHNwYWNl", GroupID(env([]byte("has space"))))
	assert.Equal(t, "b64:AP8", GroupID(env([]byte{0, 0xff})))
	long := GroupID(env(bytes.Repeat([]byte("é"), 100)))
	assert.True(t, strings.HasPrefix(long, "sha256:"), long)
	assert.Len(t, long, len("sha256:")+64)
	for _, k := range [][]byte{nil, {}, []byte("a b"), bytes.Repeat([]byte("x"), 500)} {
		g := GroupID(env(k))
		assert.True(t, validGroupID([]byte(g)), "%q", g)
	}
	assert.NotEqual(t, GroupID(env([]byte("a b"))), GroupID(env([]byte("a c"))))
}

func TestSplit(t *testing.T) {
	t.Parallel()
	mk := func(sizes ...int) []*pending {
		ps := make([]*pending, len(sizes))
		for i, s := range sizes {
			ps[i] = &pending{index: i, size: s}
		}
		return ps
	}
	lens := func(chunks [][]*pending) []int {
		var out []int
		for _, c := range chunks {
			out = append(out, len(c))
		}
		return out
	}
	assert.Equal(t, []int{10, 10, 3}, lens(split(mk(make([]int, 23)...), 100)))
	assert.Equal(t, []int{2, 2, 1}, lens(split(mk(40, 60, 50, 30, 21), 100)))
	assert.Equal(t, []int{1, 1}, lens(split(mk(100, 100), 100)))
	assert.Nil(t, split(nil, 100))
}

func TestSplitFIFO(t *testing.T) {
	t.Parallel()
	var entries []*pending
	add := func(group string, keyed bool, size int) {
		entries = append(entries, &pending{index: len(entries), group: group, keyed: keyed, size: size})
	}
	// a1 a2 b1 b2 x1 x2 (x keyless) c1
	add("a", true, 1)
	add("a", true, 1)
	add("b", true, 1)
	add("b", true, 1)
	add("bucket:1", false, 1)
	add("bucket:1", false, 1)
	add("c", true, 1)
	chunks := splitFIFO(entries, 100)
	var got [][]int
	for _, c := range chunks {
		var idx []int
		for _, p := range c {
			idx = append(idx, p.index)
		}
		got = append(got, idx)
	}
	assert.Equal(t, [][]int{{0, 2, 4, 5, 6}, {1, 3}}, got, "one message per key per request, keyless ones together, order kept")

	// Size and count limits still apply.
	entries = nil
	for range 12 {
		add("bucket:0", false, 40)
	}
	chunks = splitFIFO(entries, 100)
	require.Len(t, chunks, 6)
	for _, c := range chunks {
		assert.Len(t, c, 2)
	}
	entries = nil
	for i := range 23 {
		add(fmt.Sprint(i), true, 1)
	}
	assert.Len(t, splitFIFO(entries, 100), 3)
}

func TestValidText(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "abc", "\t\r\n", "\u00e9", "\uD7FF", "\uE000", "\uFFFD", "\U00010000", "\U0010FFFF"} {
		assert.True(t, validText([]byte(ok)), "%q", ok)
	}
	for _, bad := range []string{"\x00", "\x1f", "\uFFFE", "\uFFFF", "\xc3", "\xed\xa0\x80"} {
		assert.False(t, validText([]byte(bad)), "%q", bad)
	}
}

// queueLimitFor is the inverse of limitFor: the smallest queue limit that carries a
// MaxMessageSize.
func TestQueueLimitForInvertsLimitFor(t *testing.T) {
	t.Parallel()
	for _, stampKey := range []bool{false, true} {
		for size := limitFor(MinQueueLimit, stampKey); size <= limitFor(MaxQueueLimit, stampKey); size += 997 {
			need := queueLimitFor(size, stampKey)
			require.GreaterOrEqual(t, limitFor(need, stampKey), size)
			require.Less(t, limitFor(need-1, stampKey), size)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	client := &nopClient{}
	_, err := New(nil, Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.NoError(t, Config{}.Validate(), "zero values take their defaults")
	for _, bad := range []struct {
		cfg   Config
		field string
	}{
		{Config{QueueLimit: MaxQueueLimit + 1}, "Config.QueueLimit"},
		{Config{QueueLimit: MinQueueLimit - 1}, "Config.QueueLimit"},
		{Config{QueueLimit: -1}, "Config.QueueLimit"},
		{Config{Concurrency: -1}, "Config.Concurrency"},
		{Config{MaxMessageSize: -1}, "Config.MaxMessageSize"},
		{Config{MaxMessageSize: 194_699}, "raise QueueLimit (and the queues' MaximumMessageSize) to at least 262145"},
		{Config{MaxMessageSize: 784_523, QueueLimit: MaxQueueLimit}, "SQS allows at most 1048576 (a MaxMessageSize of 784522)"},
	} {
		err := bad.cfg.Validate()
		require.ErrorIs(t, err, outbox.ErrMisconfigured)
		require.ErrorContains(t, err, bad.field)
		_, err = New(client, bad.cfg)
		require.ErrorIs(t, err, outbox.ErrMisconfigured)
		require.ErrorContains(t, err, bad.field)
	}
	tr, err := New(client, Config{})
	require.NoError(t, err)
	// Three quarters (base64) of what QueueLimit leaves after the transport's reserve.
	assert.Equal(t, 194_698, tr.MaxMessageSize())
	tr, err = New(client, Config{OmitIdempotencyKey: true})
	require.NoError(t, err)
	assert.Equal(t, 194_753, tr.MaxMessageSize())
	tr, err = New(client, Config{QueueLimit: MaxQueueLimit})
	require.NoError(t, err)
	assert.Equal(t, 784_522, tr.MaxMessageSize())
	tr, err = New(client, Config{MaxMessageSize: 194_753, OmitIdempotencyKey: true})
	require.NoError(t, err, "the most the default queue limit carries without the idempotency key")
	assert.Equal(t, 194_753, tr.MaxMessageSize())
	tr, err = New(client, Config{MaxMessageSize: 1000})
	require.NoError(t, err)
	assert.Equal(t, 1000, tr.MaxMessageSize(), "a lower limit of the application's own")
	var api API
	require.True(t, tr.As(&api))
	assert.Same(t, client, api)
	var wrong *int
	assert.False(t, tr.As(&wrong))
}

// nopClient satisfies API for configuration tests that never send.
type nopClient struct{ API }

// BenchmarkEncode measures the transport's own work per message (1 KiB binary payload,
// base64, two headers, a key), without the network.
func BenchmarkEncode(b *testing.B) {
	payload := make([]byte, 1024)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	env, err := driver.NewEnvelope(outbox.Message{
		Topic: "bench", Key: []byte("customer-1"), Payload: payload,
		Headers: []outbox.Header{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}},
	}, 8)
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encode(env, DefaultQueueLimit, true); err != nil {
			b.Fatal(err)
		}
	}
}

// The reserve the documentation states.
func TestReserveAsDocumented(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 2472, reserve)
	assert.Equal(t, 2545, reserve+idempotencyOverhead)
}
