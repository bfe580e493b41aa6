package natstransport

import (
	"bytes"
	"encoding/base64"
	"errors"
	"net/textproto"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// testTransport is a transport with its defaults, for encoding without a server.
func testTransport(cfg Config) *Transport {
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = DefaultMaxPayload - framingAllowance
	}
	return &Transport{cfg: cfg, maxPayload: DefaultMaxPayload}
}

// wire sends msg's headers through the client's own encoding and parsing, as the
// server would deliver them.
func wire(t testing.TB, msg *nats.Msg) nats.Header {
	t.Helper()
	// The client writes headers as "NATS/1.0\r\n" then "Key: value\r\n" lines; build
	// the same block and parse it back with the client's decoder.
	var b bytes.Buffer
	b.WriteString("NATS/1.0\r\n")
	for k, vs := range msg.Header {
		for _, v := range vs {
			b.WriteString(k + ": " + textproto.TrimString(v) + "\r\n") // as the client writes it
		}
	}
	b.WriteString("\r\n")
	h, err := nats.DecodeHeadersMsg(b.Bytes())
	require.NoError(t, err)
	return h
}

func roundTrip(t testing.TB, tr *Transport, m outbox.Message) (*driver.Envelope, Delivery) {
	t.Helper()
	env, err := driver.NewEnvelope(m, driver.DefaultBucketCount)
	require.NoError(t, err)
	subject := env.Topic
	if tr.cfg.Subject != nil {
		subject = tr.cfg.Subject(env.Topic)
	}
	msg, err := tr.encode(env, subject)
	require.NoError(t, err)
	d, err := decode(msg.Subject, wire(t, msg), msg.Data)
	require.NoError(t, err)
	return env, d
}

// appHeaders drops what the transport stamped from a delivery's headers.
func appHeaders(d Delivery, id string, stampedKey bool) []outbox.Header {
	var out []outbox.Header
	for _, h := range d.Headers[:len(d.Headers)-1] { // the last is the stamped message id
		if stampedKey && h.Key == outbox.HeaderIdempotencyKey && string(h.Value) == id {
			continue
		}
		out = append(out, h)
	}
	return out
}

func TestEncodeRoundTrip(t *testing.T) {
	binary := []byte{0, 0xff, '\r', '\n', ' ', 0x80}
	cases := map[string]outbox.Message{
		"plain":            {Key: []byte("order-7"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "a", Value: []byte("2")}, {Key: "b", Value: []byte{}}}},
		"no headers":       {Key: []byte("k"), Payload: []byte("p")},
		"nil key":          {Payload: []byte("p")},
		"empty key":        {Key: []byte{}, Payload: []byte("p")},
		"binary key":       {Key: binary, Payload: binary},
		"blank-edged key":  {Key: []byte(" k "), Payload: []byte("p")},
		"tombstone":        {Key: []byte("k")},
		"empty payload":    {Key: []byte("k"), Payload: []byte{}},
		"unsorted headers": {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "b", Value: []byte("1")}, {Key: "a", Value: []byte("2")}}},
		"binary header":    {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "a", Value: binary}}},
		"unicode name":     {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "ключ", Value: []byte("v")}}},
		"reserved names":   {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "Nats-Expected-Stream", Value: []byte("x")}, {Key: HeaderKey, Value: []byte("y")}}},
		"app idempotency":  {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("mine")}}},
		"packed app idem":  {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "z", Value: binary}, {Key: outbox.HeaderIdempotencyKey, Value: []byte("mine")}}},
		"app message id":   {Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: outbox.HeaderMessageID, Value: []byte("theirs")}}},
	}
	for name, m := range cases {
		t.Run(name, func(t *testing.T) {
			m.Topic = "orders.placed"
			env, d := roundTrip(t, testTransport(Config{}), m)
			id := env.ID.String()
			assert.Equal(t, env.ID, d.ID)
			assert.Equal(t, "orders.placed", d.Topic)
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
			if !appKey {
				v, ok := d.Header(outbox.HeaderIdempotencyKey)
				assert.True(t, ok)
				assert.Equal(t, id, string(v))
			}
			last := d.Headers[len(d.Headers)-1]
			assert.Equal(t, outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(id)}, last, "the message id comes last")
		})
	}
}

func TestEncodeStampsMessageIDForTheDuplicateWindow(t *testing.T) {
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: []byte("p")}, 1)
	require.NoError(t, err)
	msg, err := testTransport(Config{}).encode(env, "t")
	require.NoError(t, err)
	assert.Equal(t, env.ID.String(), msg.Header.Get(jetstream.MsgIDHeader))
	assert.Equal(t, env.ID.String(), msg.Header.Get(outbox.HeaderMessageID))
	assert.Equal(t, env.ID.String(), msg.Header.Get(outbox.HeaderIdempotencyKey))

	msg, err = testTransport(Config{OmitIdempotencyKey: true}).encode(env, "t")
	require.NoError(t, err)
	assert.Empty(t, msg.Header.Values(outbox.HeaderIdempotencyKey), "OmitIdempotencyKey drops the header")
}

func TestSubjectMappingKeepsTheTopic(t *testing.T) {
	tr := testTransport(Config{Subject: func(topic string) string { return "outbox." + topic }})
	_, d := roundTrip(t, tr, outbox.Message{Topic: "order-placed", Payload: []byte("p")})
	assert.Equal(t, "outbox.order-placed", d.Subject)
	assert.Equal(t, "order-placed", d.Topic)
}

func TestEncodeRefusesOversizedMessages(t *testing.T) {
	tr := testTransport(Config{MaxMessageSize: 100})
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: make([]byte, 200)}, 1)
	require.NoError(t, err)
	_, err = tr.encode(env, "t")
	assert.True(t, driver.IsPermanent(err))
	assert.ErrorIs(t, err, outbox.ErrTooLarge)

	// Within MaxMessageSize, but a binary key takes 4/3 on the wire.
	tr = testTransport(Config{})
	env, err = driver.NewEnvelope(outbox.Message{Topic: "t", Key: bytes.Repeat([]byte{0xff}, DefaultMaxPayload-framingAllowance-10)}, 1)
	require.NoError(t, err)
	_, err = tr.encode(env, "t")
	assert.True(t, driver.IsPermanent(err))
	assert.ErrorIs(t, err, outbox.ErrTooLarge)
	assert.ErrorContains(t, err, "max_payload")
}

func TestValidSubject(t *testing.T) {
	for _, s := range []string{"a", "orders.placed", "a-b_c.1", "ключ"} {
		assert.NoError(t, validSubject(s), s)
	}
	for _, s := range []string{"", ".a", "a.", "a..b", "a.*", ">", "a b", "a\tb", "a\x00"} {
		assert.Error(t, validSubject(s), "%q", s)
	}
	si := testTransport(Config{Subject: func(string) string { return "orders.*" }}).subjectOf("orders")
	assert.True(t, driver.IsPermanent(si.err))
	assert.ErrorIs(t, si.err, outbox.ErrInvalidMessage)
}

func TestHoldBackTails(t *testing.T) {
	mk := func(key string) *driver.Envelope {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: []byte(key), Payload: []byte("p")}, 1)
		require.NoError(t, err)
		return env
	}
	batch := []*driver.Envelope{mk("a"), mk("b"), mk("a"), mk("b"), mk("c"), mk("c")}
	transient := errors.New("lost")
	errs := []error{transient, driver.Permanent(errors.New("too big")), nil, nil, nil, nil}
	transportkit.HoldBackTails(batch, errs, errHeldBack)
	assert.ErrorIs(t, errs[2], errHeldBack, "a's later message follows a transient failure")
	assert.ErrorIs(t, errs[3], errHeldBack, "b's later message waits until the dispatcher parked the earlier one")
	assert.NoError(t, errs[4])
	assert.NoError(t, errs[5])
}

func TestConfigValidate(t *testing.T) {
	assert.NoError(t, Config{}.Validate())
	err := Config{MaxMessageSize: -1}.Validate()
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.ErrorContains(t, err, "Config.MaxMessageSize")
	_, err = New(nil, Config{})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
}

func TestDecodeRefusesForeignMessages(t *testing.T) {
	_, err := decode("t", nats.Header{}, []byte("p"))
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = decode("t", nats.Header{outbox.HeaderMessageID: {"not-a-uuid"}}, []byte("p"))
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = decode("t", nats.Header{outbox.HeaderMessageID: {"0190a0b0-0000-7000-8000-000000000000"}, HeaderPacked: {"!!"}}, nil)
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
}

// Headers NATS cannot carry travel packed in the driver's header encoding, base64:
// the same bytes every store writes, nil and empty values kept apart.
func TestPackedHeadersUseTheDriverEncoding(t *testing.T) {
	headers := []outbox.Header{{Key: "ключ", Value: []byte("v")}, {Key: "nil", Value: nil}, {Key: "empty", Value: []byte{}}, {Key: "bin", Value: []byte{0, 0xff, '\n'}}}
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: []byte("p"), Headers: headers}, 1)
	require.NoError(t, err)
	msg, err := testTransport(Config{}).encode(env, "t")
	require.NoError(t, err)
	packed, err := base64.StdEncoding.DecodeString(msg.Header.Get(HeaderPacked))
	require.NoError(t, err)
	assert.Equal(t, driver.EncodeHeaders(headers), packed)
	for _, h := range headers {
		assert.Empty(t, msg.Header.Values(h.Key), "%s travels packed only", h.Key)
	}

	d, err := decode(msg.Subject, wire(t, msg), msg.Data)
	require.NoError(t, err)
	assert.Equal(t, headers, appHeaders(d, env.ID.String(), true), "nil stays nil, empty stays empty")

	// A packed value that is base64 but not the driver's encoding is refused.
	_, err = decode("t", nats.Header{
		outbox.HeaderMessageID: {env.ID.String()},
		HeaderPacked:           {base64.StdEncoding.EncodeToString([]byte{1, 1, 9, 'a'})},
	}, nil)
	assert.ErrorIs(t, err, outbox.ErrInvalidMessage)
	assert.ErrorIs(t, err, driver.ErrCorrupt)
}

func FuzzEncodeRoundTrip(f *testing.F) {
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
		env, d := roundTrip(t, testTransport(Config{}), m)
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
