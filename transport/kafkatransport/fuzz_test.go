package kafkatransport_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// FuzzDecode: any consumed record is decoded or refused with ErrInvalidMessage, never
// a panic; a decoded record keeps its key, value and headers byte for byte, and its
// ID is the last message-id header.
func FuzzDecode(f *testing.F) {
	id := uuid.Must(uuid.NewV7())
	f.Add([]byte("k"), []byte("v"), "traceparent", []byte("00-1-2-01"), []byte(id.String()), false)
	f.Add([]byte{}, []byte(nil), "\x00\xff", []byte{}, []byte("not-a-uuid"), true)
	f.Add([]byte(nil), []byte{0xff}, "", []byte(nil), id[:], false)
	f.Fuzz(func(t *testing.T, key, value []byte, name string, hv, rawID []byte, omitID bool) {
		rec := &kgo.Record{Topic: "t", Key: key, Value: value, Partition: 3, Offset: 9}
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: name, Value: hv})
		if !omitID {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: outbox.HeaderMessageID, Value: rawID})
		}
		d, err := kafkatransport.Decode(rec)
		if err != nil {
			if !errors.Is(err, outbox.ErrInvalidMessage) {
				t.Fatalf("a refusal must wrap ErrInvalidMessage: %v", err)
			}
			return
		}
		want, perr := uuid.ParseBytes(rawID)
		if omitID && name == outbox.HeaderMessageID {
			want, perr = uuid.ParseBytes(hv)
		}
		if perr != nil || d.ID != want {
			t.Fatalf("id %s decoded, header says %q", d.ID, rawID)
		}
		if !bytes.Equal(d.Key, key) || (d.Key == nil) != (key == nil) || !bytes.Equal(d.Payload, value) || (d.Payload == nil) != (value == nil) {
			t.Fatalf("key or value changed: %q/%q, want %q/%q", d.Key, d.Payload, key, value)
		}
		if len(d.Headers) != len(rec.Headers) || d.Headers[0].Key != name || !bytes.Equal(d.Headers[0].Value, hv) {
			t.Fatalf("headers changed: %q", d.Headers)
		}
		if d.Partition == nil || *d.Partition != 3 || d.Offset != 9 {
			t.Fatalf("partition/offset lost")
		}
	})
}
