package dynamodb

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
)

// headerCodecV1 is the only header encoding so far. The version byte comes first so a
// later encoding can be told apart from this one by every reader.
const headerCodecV1 byte = 1

// errHeaderCodec reports a Headers attribute that is not a valid encoding.
var errHeaderCodec = errors.New("dynamodb: malformed Headers attribute")

// EncodeHeaders encodes headers in the format stored in a message item's Headers
// attribute. Version 1 is:
//
//	version   1 byte, 0x01
//	count     uvarint, the number of headers
//	per header, in order:
//	  key     uvarint byte length, then the key's bytes
//	  value   uvarint (byte length + 1), then the value's bytes; 0 means a null value
//
// Uvarints are the unsigned LEB128 varints of encoding/binary, minimally encoded. Null
// and empty values stay distinct, as Kafka keeps them; keys may repeat.
func EncodeHeaders(headers []outbox.Header) []byte {
	size := 1 + binary.MaxVarintLen64
	for _, h := range headers {
		size += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	b := make([]byte, 0, size)
	b = append(b, headerCodecV1)
	b = binary.AppendUvarint(b, uint64(len(headers)))
	for _, h := range headers {
		b = binary.AppendUvarint(b, uint64(len(h.Key)))
		b = append(b, h.Key...)
		if h.Value == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(h.Value))+1)
		b = append(b, h.Value...)
	}
	return b
}

// DecodeHeaders decodes a Headers attribute written by [EncodeHeaders]. It refuses
// unknown versions, truncated or trailing bytes and non-minimal varints, so every
// accepted input re-encodes to the same bytes. A zero count decodes to an empty,
// non-nil slice.
func DecodeHeaders(b []byte) ([]outbox.Header, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: empty", errHeaderCodec)
	}
	if b[0] != headerCodecV1 {
		return nil, fmt.Errorf("%w: unknown version %d", errHeaderCodec, b[0])
	}
	r := headerReader{b: b[1:]}
	count, err := r.uvarint()
	if err != nil {
		return nil, err
	}
	// Each header takes at least two bytes, which bounds the allocation below.
	if count > uint64(len(r.b))/2 {
		return nil, fmt.Errorf("%w: %d headers cannot fit in %d bytes", errHeaderCodec, count, len(r.b))
	}
	headers := make([]outbox.Header, 0, count)
	for range count {
		keyLen, err := r.uvarint()
		if err != nil {
			return nil, err
		}
		key, err := r.bytes(keyLen)
		if err != nil {
			return nil, err
		}
		valLen, err := r.uvarint()
		if err != nil {
			return nil, err
		}
		var value []byte
		if valLen > 0 {
			raw, err := r.bytes(valLen - 1)
			if err != nil {
				return nil, err
			}
			value = append(make([]byte, 0, len(raw)), raw...)
		}
		headers = append(headers, outbox.Header{Key: string(key), Value: value})
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", errHeaderCodec, len(r.b))
	}
	return headers, nil
}

type headerReader struct{ b []byte }

func (r *headerReader) uvarint() (uint64, error) {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		return 0, fmt.Errorf("%w: bad varint", errHeaderCodec)
	}
	// Refuse padded varints: the encoding of a value is unique.
	if n != uvarintLen(v) {
		return 0, fmt.Errorf("%w: non-minimal varint", errHeaderCodec)
	}
	r.b = r.b[n:]
	return v, nil
}

func (r *headerReader) bytes(n uint64) ([]byte, error) {
	if n > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: length %d overruns the %d bytes left", errHeaderCodec, n, len(r.b))
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out, nil
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
