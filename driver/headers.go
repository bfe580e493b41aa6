package driver

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
)

// ErrCorrupt reports stored or received bytes that are not a valid encoding, such as
// a headers field that [DecodeHeaders] refuses.
var ErrCorrupt = errors.New("outbox: corrupt encoding")

// headersV1 is the only header encoding so far. The version byte comes first so a later
// encoding can be told apart by every reader.
const headersV1 byte = 1

// EncodeHeaders encodes headers in the binary form every store, and every transport
// that packs headers into one field, uses: the SQL headers column, the DynamoDB
// Headers attribute, the packed SQS attribute, the Redis stream entry's headers field
// and, base64-encoded since NATS header values are text, the packed NATS header.
// Transports that carry headers as the broker's own keep them there instead: Kafka
// record headers, RabbitMQ header tables, Watermill metadata, and NATS headers when
// every header survives as one. Version 1 is:
//
//	version   1 byte, 0x01
//	count     uvarint, the number of headers
//	per header, in order:
//	  key     uvarint byte length, then the key's bytes
//	  value   uvarint (byte length + 1), then the value's bytes; 0 means a nil value
//
// Uvarints are the unsigned LEB128 varints of encoding/binary, minimally encoded. Nil
// and empty values stay distinct, as Kafka keeps them; keys may repeat.
func EncodeHeaders(headers []outbox.Header) []byte {
	size := 1 + binary.MaxVarintLen64
	for _, h := range headers {
		size += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
	}
	b := make([]byte, 0, size)
	b = append(b, headersV1)
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

// DecodeHeaders decodes what [EncodeHeaders] wrote. It refuses, with an error wrapping
// [ErrCorrupt], unknown versions, truncated or trailing bytes and non-minimal
// varints, so every accepted input re-encodes to the same bytes. A zero count decodes
// to an empty, non-nil slice.
func DecodeHeaders(b []byte) ([]outbox.Header, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: headers: empty", ErrCorrupt)
	}
	if b[0] != headersV1 {
		return nil, fmt.Errorf("%w: headers: unknown version %d", ErrCorrupt, b[0])
	}
	r := headerReader{b: b[1:]}
	count, err := r.uvarint()
	if err != nil {
		return nil, err
	}
	// Each header takes at least two bytes, which bounds the allocation below.
	if count > uint64(len(r.b))/2 {
		return nil, fmt.Errorf("%w: headers: %d cannot fit in %d bytes", ErrCorrupt, count, len(r.b))
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
		return nil, fmt.Errorf("%w: headers: %d trailing bytes", ErrCorrupt, len(r.b))
	}
	return headers, nil
}

type headerReader struct{ b []byte }

func (r *headerReader) uvarint() (uint64, error) {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		return 0, fmt.Errorf("%w: headers: bad varint", ErrCorrupt)
	}
	// Refuse padded varints: the encoding of a value is unique.
	if n != len(binary.AppendUvarint(nil, v)) {
		return 0, fmt.Errorf("%w: headers: non-minimal varint", ErrCorrupt)
	}
	r.b = r.b[n:]
	return v, nil
}

func (r *headerReader) bytes(n uint64) ([]byte, error) {
	if n > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: headers: length %d overruns the %d bytes left", ErrCorrupt, n, len(r.b))
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out, nil
}
