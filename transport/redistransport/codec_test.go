package redistransport

import (
	"bytes"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// entry turns XADD arguments into the entry a reader gets back: go-redis returns
// every field value as a string.
func entry(t testing.TB, args *redis.XAddArgs) redis.XMessage {
	t.Helper()
	values := args.Values.([]any)
	require.Zero(t, len(values)%2)
	m := redis.XMessage{ID: "1700000000000-0", Values: map[string]any{}}
	for i := 0; i < len(values); i += 2 {
		name := values[i].(string)
		_, dup := m.Values[name]
		require.False(t, dup, "field %s written twice", name)
		switch v := values[i+1].(type) {
		case string:
			m.Values[name] = v
		case []byte:
			m.Values[name] = string(v)
		default:
			t.Fatalf("field %s is a %T", name, v)
		}
	}
	return m
}

func roundTrip(t testing.TB, tr *Transport, m outbox.Message) (*driver.Envelope, Delivery) {
	t.Helper()
	env, err := driver.NewEnvelope(m, driver.DefaultBucketCount)
	require.NoError(t, err)
	args, err := tr.encode(env)
	require.NoError(t, err)
	d, err := Decode(args.Stream, entry(t, args))
	require.NoError(t, err)
	return env, d
}

func testTransport(t testing.TB, cfg Config) *Transport {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = client.Close() })
	tr, err := New(client, cfg)
	require.NoError(t, err)
	return tr
}

// appHeaders drops the stamped message id (always last) and a stamped idempotency key.
func appHeaders(d Delivery, id string, stampedKey bool) []outbox.Header {
	var out []outbox.Header
	for _, h := range d.Headers[:len(d.Headers)-1] {
		if stampedKey && h.Key == outbox.HeaderIdempotencyKey && string(h.Value) == id {
			continue
		}
		out = append(out, h)
	}
	return out
}

func TestCodecRoundTrip(t *testing.T) {
	binary := []byte{0, 0xff, '\r', '\n', ' ', 0x80}
	cases := map[string]outbox.Message{
		"plain":           {Key: []byte("order-7"), Payload: []byte("p")},
		"nil key":         {Payload: []byte("p")},
		"empty key":       {Key: []byte{}, Payload: []byte("p")},
		"binary":          {Key: binary, Payload: binary},
		"tombstone":       {Key: []byte("k")},
		"empty payload":   {Key: []byte("k"), Payload: []byte{}},
		"headers":         {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "b", Value: []byte("1")}, {Key: "a", Value: binary}, {Key: "b", Value: []byte{}}, {Key: "ключ", Value: []byte("v")}}},
		"app idempotency": {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("mine")}}},
		"app message id":  {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: outbox.HeaderMessageID, Value: []byte("theirs")}}},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			m.Topic = "orders"
			env, d := roundTrip(t, testTransport(t, Config{}), m)
			id := env.ID.String()
			assert.Equal(t, env.ID, d.ID)
			assert.Equal(t, "orders", d.Topic)
			assert.Equal(t, "orders", d.Stream)
			assert.Equal(t, int64(1700000000000), d.Timestamp.UnixMilli())
			assert.Equal(t, m.Key, d.Key)
			assert.Equal(t, m.Key == nil, d.Key == nil, "nil and empty keys stay distinct")
			assert.Equal(t, m.Payload, d.Payload)
			assert.Equal(t, m.Payload == nil, d.Payload == nil, "a tombstone stays distinct from an empty payload")
			_, appKey := m.Header(outbox.HeaderIdempotencyKey)
			want := m.Headers
			if len(want) == 0 {
				want = nil
			}
			assert.Equal(t, want, appHeaders(d, id, !appKey))
			last := d.Headers[len(d.Headers)-1]
			assert.Equal(t, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(id)}, last, "the message id comes last")
		})
	}
}

func TestEncodeOptions(t *testing.T) {
	env, err := driver.NewEnvelope(outbox.Message{Topic: "order-placed", Payload: []byte("p")}, 1)
	require.NoError(t, err)

	args, err := testTransport(t, Config{MaxLen: 1000}).encode(env)
	require.NoError(t, err)
	assert.Equal(t, int64(1000), args.MaxLen)
	assert.True(t, args.Approx, "MAXLEN is approximate")
	assert.Equal(t, "*", args.ID)
	assert.Equal(t, env.ID.String(), entry(t, args).Values[FieldIdempotencyKey])

	args, err = testTransport(t, Config{OmitIdempotencyKey: true, Stream: func(topic string) string { return "events:" + topic }}).encode(env)
	require.NoError(t, err)
	assert.Equal(t, "events:order-placed", args.Stream)
	assert.NotContains(t, entry(t, args).Values, FieldIdempotencyKey)
	d, err := Decode(args.Stream, entry(t, args))
	require.NoError(t, err)
	assert.Equal(t, "order-placed", d.Topic, "the topic travels when the stream key differs")

	_, err = testTransport(t, Config{Stream: func(string) string { return "" }}).encode(env)
	assert.True(t, driver.IsPermanent(err))
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)

	big, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: make([]byte, 200)}, 1)
	require.NoError(t, err)
	_, err = testTransport(t, Config{MaxMessageSize: 100}).encode(big)
	assert.True(t, driver.IsPermanent(err))
	assert.ErrorIs(t, err, outbox.ErrTooLarge)
}

func TestHoldBackTails(t *testing.T) {
	mk := func(key []byte) *driver.Envelope {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: key, Payload: []byte("p")}, 1)
		require.NoError(t, err)
		return env
	}
	batch := []*driver.Envelope{mk([]byte("a")), mk(nil), mk([]byte("a")), mk(nil), mk([]byte("b"))}
	errs := []error{errors.New("lost"), errors.New("lost"), nil, nil, nil}
	transportkit.HoldBackTails(batch, errs, errHeldBack)
	assert.ErrorIs(t, errs[2], errHeldBack)
	assert.NoError(t, errs[3], "keyless messages have no order")
	assert.NoError(t, errs[4])
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, Config{}.Validate())
	for field, cfg := range map[string]Config{
		"Config.MaxMessageSize": {MaxMessageSize: -1},
		"Config.MaxLen":         {MaxLen: -1},
		"Config.WaitReplicas":   {WaitReplicas: -1},
		"Config.WaitTimeout":    {WaitTimeout: -1},
	} {
		err := cfg.Validate()
		assert.ErrorIs(t, err, outbox.ErrMisconfigured)
		assert.ErrorContains(t, err, field)
	}
	_, err := New(nil, Config{})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	_, err = New(cluster, Config{WaitReplicas: 1})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.ErrorContains(t, err, "WaitReplicas")
}

func TestDecodeRefusesForeignEntries(t *testing.T) {
	_, err := Decode("s", redis.XMessage{ID: "1-0", Values: map[string]any{"payload": "x"}})
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = Decode("s", redis.XMessage{ID: "1-0", Values: map[string]any{FieldMessageID: "nope"}})
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = Decode("s", redis.XMessage{ID: "1-0", Values: map[string]any{FieldMessageID: "0190a0b0-0000-7000-8000-000000000000", FieldHeaders: "\x05ab"}})
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
}

// The headers field is the driver's header encoding, the bytes every store writes:
// nil and empty values stay apart.
func TestHeadersFieldIsTheDriverEncoding(t *testing.T) {
	headers := []outbox.Header{{Key: "ключ", Value: []byte("v")}, {Key: "nil", Value: nil}, {Key: "empty", Value: []byte{}}, {Key: "bin", Value: []byte{0, 0xff, '\n'}}}
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: []byte("p"), Headers: headers}, 1)
	require.NoError(t, err)
	args, err := testTransport(t, Config{}).encode(env)
	require.NoError(t, err)
	e := entry(t, args)
	assert.Equal(t, string(driver.EncodeHeaders(headers)), e.Values[FieldHeaders])
	d, err := Decode(args.Stream, e)
	require.NoError(t, err)
	assert.Equal(t, headers, appHeaders(d, env.ID.String(), true), "nil stays nil, empty stays empty")

	e.Values[FieldHeaders] = string([]byte{1, 1, 9, 'a'})
	_, err = Decode(args.Stream, e)
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
	assert.ErrorIs(t, err, driver.ErrCorrupt)
}

func FuzzCodecRoundTrip(f *testing.F) {
	f.Add([]byte("k"), []byte("p"), "a", []byte("v"), "b", []byte("w"))
	f.Add([]byte{}, []byte(nil), "ключ", []byte{0, '\r'}, "a", []byte(" "))
	f.Fuzz(func(t *testing.T, key, payload []byte, k1 string, v1 []byte, k2 string, v2 []byte) {
		m := outbox.Message{Topic: "t", Key: key, Payload: payload}
		for _, h := range []outbox.Header{{Key: k1, Value: v1}, {Key: k2, Value: v2}} {
			if h.Key != "" {
				m.Headers = append(m.Headers, h)
			}
		}
		if m.Validate() != nil {
			return
		}
		env, d := roundTrip(t, testTransport(t, Config{}), m)
		if !bytes.Equal(m.Key, d.Key) || (m.Key == nil) != (d.Key == nil) {
			t.Fatalf("key %q became %q", m.Key, d.Key)
		}
		if !bytes.Equal(m.Payload, d.Payload) || (m.Payload == nil) != (d.Payload == nil) {
			t.Fatalf("payload %q became %q", m.Payload, d.Payload)
		}
		_, appKey := m.Header(outbox.HeaderIdempotencyKey)
		got := appHeaders(d, env.ID.String(), !appKey)
		if len(got) != len(m.Headers) {
			t.Fatalf("headers %q became %q", m.Headers, got)
		}
		for i := range got {
			if got[i].Key != m.Headers[i].Key || !bytes.Equal(got[i].Value, m.Headers[i].Value) {
				t.Fatalf("headers %q became %q", m.Headers, got)
			}
		}
	})
}
