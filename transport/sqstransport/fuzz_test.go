package sqstransport

import (
	"bytes"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// fuzzHeaders turns fuzz input into headers: pieces cut at 0xff alternate name and
// value; a value of exactly "\x00" stands for nil. Empty names are skipped: capture
// refuses them.
func fuzzHeaders(data []byte) []outbox.Header {
	var hs []outbox.Header
	parts := bytes.Split(data, []byte{0xff})
	for i := 0; i+1 < len(parts); i += 2 {
		if len(parts[i]) == 0 {
			continue
		}
		v := parts[i+1]
		if bytes.Equal(v, []byte{0}) {
			v = nil
		}
		hs = append(hs, outbox.Header{Key: string(parts[i]), Value: v})
	}
	return hs
}

// FuzzEncodeDecodeRoundTrip: whatever key, payload and headers a message carries, the
// attributes and body the transport sends decode back to exactly the same bytes, in
// order, nil and empty kept apart.
func FuzzEncodeDecodeRoundTrip(f *testing.F) {
	f.Add([]byte("key"), []byte("hello"), []byte("traceparent\xff00-1-2-01\xffx-a\xff\x00"), false, false)
	f.Add([]byte{}, []byte{0xff, 0xfe, 0x00}, []byte("a b\xffv\xff.bad\xff\xff"), true, false)
	f.Add([]byte{0x00}, []byte{}, []byte("h1\xff1\xffh2\xff2\xffh3\xff3\xffh4\xff4\xffh5\xff5\xffh6\xff6\xffh7\xff7\xffh8\xff8\xffh9\xff9\xffh10\xff10"), false, true)
	f.Fuzz(func(t *testing.T, key, payload, headerData []byte, nilKey, nilPayload bool) {
		env := &driver.Envelope{Message: outbox.Message{ID: uuid.Must(uuid.NewV7())}}
		env.Topic = "t"
		if !nilKey {
			env.Key = key
		}
		if !nilPayload {
			env.Payload = payload
		}
		env.Headers = fuzzHeaders(headerData)
		e, err := encode(env, 1<<20, false)
		if err != nil {
			return // too large for SQS: refused, permanently
		}
		d, err := Decode(types.Message{Body: aws.String(e.body), MessageAttributes: e.attrs})
		if err != nil {
			t.Fatalf("decode what was encoded: %v", err)
		}
		if d.ID != env.ID {
			t.Fatalf("id %s, want %s", d.ID, env.ID)
		}
		if !bytes.Equal(d.Key, env.Key) || (d.Key == nil) != (env.Key == nil) {
			t.Fatalf("key %q (nil %v), want %q (nil %v)", d.Key, d.Key == nil, env.Key, env.Key == nil)
		}
		if !bytes.Equal(d.Payload, env.Payload) || (d.Payload == nil) != (env.Payload == nil) {
			t.Fatalf("payload %q (nil %v), want %q (nil %v)", d.Payload, d.Payload == nil, env.Payload, env.Payload == nil)
		}
		want := effectiveHeaders(env.Headers, env.ID.String(), false)
		if len(d.Headers) != len(want) {
			t.Fatalf("%d headers, want %d: %q", len(d.Headers), len(want), d.Headers)
		}
		for i := range want {
			if d.Headers[i].Key != want[i].Key || !bytes.Equal(d.Headers[i].Value, want[i].Value) {
				t.Fatalf("header %d: %q=%q, want %q=%q", i, d.Headers[i].Key, d.Headers[i].Value, want[i].Key, want[i].Value)
			}
		}
	})
}

// FuzzDecode: a received message with arbitrary attributes is decoded or refused
// with an error, never a panic.
func FuzzDecode(f *testing.F) {
	id := uuid.Must(uuid.NewV7()).String()
	f.Add(id, "body", "b64", driver.EncodeHeaders([]outbox.Header{{Key: "a", Value: []byte("b")}}), "x", []byte("v"))
	f.Add(id, "!!!", "b64;h=x,~,"+AttrMessageID, []byte{1, 0xff}, "x", []byte(nil))
	f.Add("nope", "", "", []byte(nil), "", []byte(nil))
	f.Fuzz(func(t *testing.T, rawID, body, layout string, packed []byte, name string, value []byte) {
		attrs := map[string]types.MessageAttributeValue{AttrMessageID: stringAttr(rawID)}
		if layout != "" {
			attrs[AttrLayout] = stringAttr(layout)
		}
		if packed != nil {
			attrs[AttrHeaders] = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: packed}
		}
		if name != "" {
			attrs[name] = types.MessageAttributeValue{DataType: aws.String("Binary"), BinaryValue: value}
		}
		_, _ = Decode(types.Message{Body: aws.String(body), MessageAttributes: attrs})
	})
}
