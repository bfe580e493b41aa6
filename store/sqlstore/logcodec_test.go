package sqlstore

import (
	"bytes"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// A log record decodes to the envelopes it was encoded from, nil and empty kept apart;
// a unit larger than a record's limit spans several records, in order.
func TestLogRecordRoundTrip(t *testing.T) {
	part := int32(7)
	msgs := []outbox.Message{
		{Topic: "orders", Key: []byte("k"), Payload: []byte{}, Headers: []outbox.Header{{Key: "a", Value: []byte("v")}, {Key: "n"}}, Partition: &part},
		{Topic: "audit"},
		{Topic: "big", Payload: bytes.Repeat([]byte("x"), logRecordLimit)},
		{Topic: "after", Key: []byte{}},
	}
	envs, err := driver.NewEnvelopes(msgs, 16)
	require.NoError(t, err)
	records := encodeLogRecords(envs)
	require.Len(t, records, 3, "the large message takes a record alone")
	var got []*driver.Envelope
	for _, r := range records {
		out, err := decodeLogRecord(r)
		require.NoError(t, err)
		got = append(got, out...)
	}
	require.Len(t, got, len(envs))
	for i, want := range envs {
		want.CreatedAt = fromMicros(micros(want.CreatedAt))
		require.Equal(t, want, got[i], "message %d", i)
	}
}

// Any bytes decode to envelopes or an error wrapping driver.ErrCorrupt, never a panic.
func FuzzLogRecord(f *testing.F) {
	envs, _ := driver.NewEnvelopes([]outbox.Message{
		{ID: uuid.Must(uuid.NewV7()), Topic: "t", Key: []byte("k"), Payload: []byte("p"), Headers: []outbox.Header{{Key: "h"}}},
	}, 8)
	f.Add(encodeLogRecords(envs)[0])
	f.Add([]byte{logRecordV1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := decodeLogRecord(b)
		if err != nil {
			require.ErrorIs(t, err, driver.ErrCorrupt)
			return
		}
		for _, env := range out {
			require.NotNil(t, env)
		}
	})
}
