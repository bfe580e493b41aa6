package sqlstore

import (
	"bytes"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
)

// headersFrom turns fuzz input into a header list: data is cut at every 0xff byte;
// pieces alternate key, value, and a value of exactly "\x00" stands for nil.
func headersFrom(data []byte) []outbox.Header {
	var hs []outbox.Header
	parts := bytes.Split(data, []byte{0xff})
	for i := 0; i+1 < len(parts); i += 2 {
		v := parts[i+1]
		if bytes.Equal(v, []byte{0}) {
			v = nil
		}
		hs = append(hs, outbox.Header{Key: string(parts[i]), Value: v})
	}
	return hs
}

func sameHeaders(t *testing.T, want, got []outbox.Header) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%d headers decoded, want %d", len(got), len(want))
	}
	for i := range want {
		if want[i].Key != got[i].Key || !bytes.Equal(want[i].Value, got[i].Value) || (want[i].Value == nil) != (got[i].Value == nil) {
			t.Fatalf("header %d: got %q=%q (nil %v), want %q=%q (nil %v)", i,
				got[i].Key, got[i].Value, got[i].Value == nil, want[i].Key, want[i].Value, want[i].Value == nil)
		}
	}
}

// FuzzHeaderCodecRoundTrip: any header list survives the headers column unchanged,
// nil and empty values kept apart.
func FuzzHeaderCodecRoundTrip(f *testing.F) {
	f.Add([]byte("traceparent\xff00-abc-01\xffk\xff\x00\xffempty\xff"))
	f.Add([]byte("\x00\x01\x02\xff\xfe\xfd\xff\xff\xff"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		hs := headersFrom(data)
		got, err := decodeHeaders(encodeHeaders(hs))
		if err != nil {
			t.Fatalf("decode what was encoded: %v", err)
		}
		sameHeaders(t, hs, got)
	})
}

// FuzzDecodeHeaders: a corrupt headers column is an error, never a panic or a huge
// allocation, and what does decode encodes back to something that decodes the same.
func FuzzDecodeHeaders(f *testing.F) {
	f.Add(encodeHeaders([]outbox.Header{{Key: "a", Value: []byte("b")}, {Key: "n", Value: nil}}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add([]byte{0x02, 0x01, 'k', 0x05, 'v'})
	f.Add([]byte{0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := decodeHeaders(b)
		if err != nil {
			return
		}
		again, err := decodeHeaders(encodeHeaders(hs))
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		sameHeaders(t, hs, again)
	})
}

// FuzzEnvelopeRow: any row a database could hand back (a corrupt one included)
// becomes an envelope or an error, never a panic; the flags decide nil against empty.
func FuzzEnvelopeRow(f *testing.F) {
	id := uuid.Must(uuid.NewV7())
	f.Add(id[:], int64(flagKey|flagPayload|flagHeaders|flagPartition), []byte("k"), []byte("p"),
		encodeHeaders([]outbox.Header{{Key: "h", Value: []byte("v")}}), int64(3), int64(1_700_000_000_000_000), int64(0))
	f.Add([]byte(id.String()), int64(0), []byte(nil), []byte(nil), []byte(nil), int64(-1), int64(-1), int64(7))
	f.Add([]byte("not a uuid"), int64(-1), []byte{}, []byte{}, []byte{0xff}, int64(1<<40), int64(1<<62), int64(2))
	f.Fuzz(func(t *testing.T, rawID []byte, flags int64, key, payload, headers []byte, part, created, status int64) {
		var r envelopeRow
		if err := r.id.Scan(rawID); err != nil {
			return
		}
		r.flags, r.key, r.payload, r.headers, r.part, r.created, r.status = flags, key, payload, headers, part, created, status
		env, err := r.envelope()
		if err != nil {
			return
		}
		if (flags&flagKey != 0) != (env.Key != nil) {
			t.Fatalf("key presence %v with flags %b", env.Key != nil, flags)
		}
		if (flags&flagPayload != 0) != (env.Payload != nil) {
			t.Fatalf("payload presence %v with flags %b", env.Payload != nil, flags)
		}
		if env.Key != nil && !bytes.Equal(env.Key, key) {
			t.Fatalf("key %q, stored %q", env.Key, key)
		}
	})
}
