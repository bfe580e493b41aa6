package sqlstore

import (
	"bytes"
	"testing"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// FuzzEnvelopeRow: any row a database could hand back (a corrupt one included)
// becomes an envelope or an error, never a panic; the flags decide nil against empty.
func FuzzEnvelopeRow(f *testing.F) {
	id := uuid.Must(uuid.NewV7())
	f.Add(id[:], int64(flagKey|flagPayload|flagHeaders|flagPartition), []byte("k"), []byte("p"),
		driver.EncodeHeaders([]outbox.Header{{Key: "h", Value: []byte("v")}}), int64(3), int64(1_700_000_000_000_000), int64(0))
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
