package driver_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

func TestHeaderCodec(t *testing.T) {
	t.Parallel()
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	cases := [][]outbox.Header{
		{},
		{{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")}},
		{{Key: "dup", Value: []byte("1")}, {Key: "dup", Value: []byte("2")}},
		{{Key: "null", Value: nil}, {Key: "empty", Value: []byte{}}},
		{{Key: "binary", Value: every}, {Key: "ключ", Value: bytes.Repeat([]byte("x"), 300)}},
	}
	for _, headers := range cases {
		enc := driver.EncodeHeaders(headers)
		assert.Equal(t, byte(1), enc[0], "version byte first")
		got, err := driver.DecodeHeaders(enc)
		require.NoError(t, err)
		require.NotNil(t, got)
		require.Len(t, got, len(headers))
		for i, h := range headers {
			assert.Equal(t, h.Key, got[i].Key)
			assert.Equal(t, h.Value == nil, got[i].Value == nil, "null and empty values stay distinct")
			assert.Equal(t, h.Value, got[i].Value)
		}
	}

	// The layout, byte by byte: version, count, then key and value+1 lengths.
	assert.Equal(t, []byte{1, 2, 1, 'a', 2, 'b', 1, 'c', 0},
		driver.EncodeHeaders([]outbox.Header{{Key: "a", Value: []byte("b")}, {Key: "c", Value: nil}}))

	for name, bad := range map[string][]byte{
		"empty":           {},
		"unknown version": {2, 0},
		"truncated count": {1},
		"count too large": {1, 5, 0, 0},
		"key overruns":    {1, 1, 9, 'a', 0},
		"value overruns":  {1, 1, 1, 'a', 5, 'b'},
		"trailing bytes":  {1, 0, 0},
		"padded varint":   {1, 0x80, 0x00},
	} {
		_, err := driver.DecodeHeaders(bad)
		assert.ErrorIs(t, err, driver.ErrCorrupt, name)
	}
}

// FuzzHeaderCodec checks that decoding never panics, that whatever decodes re-encodes
// to the same bytes (the encoding is canonical), and that headers built from the
// input survive a round trip.
func FuzzHeaderCodec(f *testing.F) {
	f.Add([]byte{1, 0})
	f.Add([]byte{1, 2, 1, 'a', 2, 'b', 1, 'c', 0})
	f.Add(driver.EncodeHeaders([]outbox.Header{{Key: "k", Value: []byte{}}, {Key: "", Value: []byte{0xff}}}))
	f.Add([]byte{2, 0})
	f.Add([]byte{1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		if headers, err := driver.DecodeHeaders(data); err == nil {
			if again := driver.EncodeHeaders(headers); !bytes.Equal(again, data) {
				t.Fatalf("decoded %x, re-encoded %x", data, again)
			}
		}
		// Split the input into headers: key length from one byte, a null value when
		// the next byte is odd.
		var headers []outbox.Header
		for rest := data; len(rest) >= 2; {
			n := min(int(rest[0])%8, len(rest)-2)
			key := string(rest[2 : 2+n])
			var value []byte
			if rest[1]%2 == 0 {
				value = rest[2 : 2+n]
			}
			headers = append(headers, outbox.Header{Key: key, Value: value})
			rest = rest[2+n:]
		}
		got, err := driver.DecodeHeaders(driver.EncodeHeaders(headers))
		if err != nil {
			t.Fatalf("round trip: %v", err)
		}
		if len(got) != len(headers) {
			t.Fatalf("round trip: %d headers, want %d", len(got), len(headers))
		}
		for i := range headers {
			if got[i].Key != headers[i].Key || !bytes.Equal(got[i].Value, headers[i].Value) || (got[i].Value == nil) != (headers[i].Value == nil) {
				t.Fatalf("header %d: got %+v, want %+v", i, got[i], headers[i])
			}
		}
	})
}
