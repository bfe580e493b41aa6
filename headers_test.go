package outbox_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
)

func TestHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	for _, hs := range [][]outbox.Header{
		nil,
		{{Key: "a", Value: []byte("b")}},
		{{Key: "dup", Value: []byte("1")}, {Key: "dup", Value: []byte("2")}},
		{{Key: "nil", Value: nil}, {Key: "empty", Value: []byte{}}},
		{{Key: string(every), Value: every}},
	} {
		enc := outbox.EncodeHeaders(hs)
		require.Equal(t, byte(1), enc[0], "leading version byte")
		got, err := outbox.DecodeHeaders(enc)
		require.NoError(t, err)
		require.Equal(t, hs, got)
	}
	// The layout is documented byte for byte; pin it.
	require.Equal(t, []byte{1, 2, 1, 'a', 2, 'b', 1, 'n', 0},
		outbox.EncodeHeaders([]outbox.Header{{Key: "a", Value: []byte("b")}, {Key: "n"}}))
}

func TestDecodeHeadersRefusesCorruptInput(t *testing.T) {
	t.Parallel()
	good := outbox.EncodeHeaders([]outbox.Header{{Key: "name", Value: []byte("value")}})
	for i := range len(good) {
		_, err := outbox.DecodeHeaders(good[:i])
		require.ErrorIs(t, err, outbox.ErrCorrupt, "truncated to %d bytes", i)
	}
	for _, bad := range [][]byte{
		{2, 0},                   // unknown version
		append(good, 0),          // trailing byte
		{1, 0x80, 0x00},          // non-minimal varint
		{1, 0xff, 0xff, 0xff, 1}, // count that cannot fit
	} {
		_, err := outbox.DecodeHeaders(bad)
		require.ErrorIs(t, err, outbox.ErrCorrupt, "%x", bad)
	}
}

// FuzzDecodeHeaders: any input is refused with an error or decodes to headers that
// re-encode to the very same bytes; never a panic.
func FuzzDecodeHeaders(f *testing.F) {
	f.Add(outbox.EncodeHeaders(nil))
	f.Add(outbox.EncodeHeaders([]outbox.Header{{Key: "a", Value: []byte("b")}, {Key: "n"}, {Key: "e", Value: []byte{}}}))
	f.Add([]byte{1, 0x80, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, err := outbox.DecodeHeaders(b)
		if err != nil {
			return
		}
		if again := outbox.EncodeHeaders(hs); !bytes.Equal(again, b) {
			t.Fatalf("%x decoded to %v, which encodes to %x", b, hs, again)
		}
	})
}
