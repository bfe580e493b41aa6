package sqlstore

import (
	"encoding/binary"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/driver"
)

// The log mode writes messages into PostgreSQL's write-ahead log as logical decoding
// messages (pg_logical_emit_message), one record holding one or more messages of a
// transaction, in the order they were sent. Version 1 of a record's content is:
//
//	version        1 byte, 0x01
//	count          uvarint, the number of messages
//	per message, in order:
//	  id           16 bytes
//	  bucket       uvarint
//	  bucket count uvarint
//	  created      varint, microseconds since the Unix epoch (0: none)
//	  flags        1 byte: key, payload, headers, partition present (bits 0..3)
//	  topic        uvarint byte length, then the bytes
//	  key          if flagged: uvarint byte length, then the bytes
//	  payload      if flagged: uvarint byte length, then the bytes
//	  headers      if flagged: uvarint byte length, then driver.EncodeHeaders' bytes
//	  partition    if flagged: varint
//
// Varints are encoding/binary's. Nil and empty stay distinct, as in the table.
const logRecordV1 byte = 1

// logRecordLimit is the content size past which a unit's messages go into more than
// one record (a larger message still takes one record alone).
const logRecordLimit = 1 << 20

// encodeLogRecords packs envs into records of about logRecordLimit bytes at most.
func encodeLogRecords(envs []*driver.Envelope) [][]byte {
	var out [][]byte
	for len(envs) > 0 {
		n, size := 0, 1+binary.MaxVarintLen64
		for n < len(envs) {
			m := envs[n]
			sz := 16 + 4*binary.MaxVarintLen64 + 1 + 5*binary.MaxVarintLen64 + len(m.Topic) + len(m.Key) + len(m.Payload)
			for _, h := range m.Headers {
				sz += 2*binary.MaxVarintLen64 + len(h.Key) + len(h.Value)
			}
			if n > 0 && size+sz > logRecordLimit {
				break
			}
			size += sz
			n++
		}
		out = append(out, encodeLogRecord(envs[:n], size))
		envs = envs[n:]
	}
	return out
}

func encodeLogRecord(envs []*driver.Envelope, size int) []byte {
	b := make([]byte, 0, size)
	b = append(b, logRecordV1)
	b = binary.AppendUvarint(b, uint64(len(envs)))
	for _, env := range envs {
		b = append(b, env.ID[:]...)
		b = binary.AppendUvarint(b, uint64(env.Bucket))
		b = binary.AppendUvarint(b, uint64(env.BucketCount))
		b = binary.AppendVarint(b, micros(env.CreatedAt))
		flags := messageFlags(&env.Message)
		b = append(b, byte(flags))
		b = appendBytes(b, []byte(env.Topic))
		if flags&flagKey != 0 {
			b = appendBytes(b, env.Key)
		}
		if flags&flagPayload != 0 {
			b = appendBytes(b, env.Payload)
		}
		if flags&flagHeaders != 0 {
			b = appendBytes(b, driver.EncodeHeaders(env.Headers))
		}
		if flags&flagPartition != 0 {
			b = binary.AppendVarint(b, int64(*env.Partition))
		}
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// decodeLogRecord decodes a record's content into pending envelopes; bytes that are
// not a valid record wrap [driver.ErrCorrupt].
func decodeLogRecord(b []byte) ([]*driver.Envelope, error) {
	d := logDecoder{b: b}
	if len(b) == 0 || b[0] != logRecordV1 {
		return nil, fmt.Errorf("%w: sqlstore: a log record of an unknown version (%d bytes)", driver.ErrCorrupt, len(b))
	}
	d.b = d.b[1:]
	count := d.uvarint()
	if d.err == nil && count > uint64(len(d.b)/17) {
		d.fail("message count")
	}
	var out []*driver.Envelope
	for i := uint64(0); i < count && d.err == nil; i++ {
		env := &driver.Envelope{Status: driver.Pending}
		copy(env.ID[:], d.take(16))
		env.Bucket = d.int("bucket")
		env.BucketCount = d.int("bucket count")
		env.CreatedAt = fromMicros(d.varint())
		flags := int64(d.byte())
		env.Topic = string(d.bytes())
		if flags&flagKey != 0 {
			env.Key = nonNil(d.bytes())
		}
		if flags&flagPayload != 0 {
			env.Payload = nonNil(d.bytes())
		}
		if flags&flagHeaders != 0 {
			raw := d.bytes()
			if d.err == nil {
				hs, err := driver.DecodeHeaders(raw)
				if err != nil {
					return nil, fmt.Errorf("%w (message %s)", err, uuid.UUID(env.ID))
				}
				env.Headers = hs
			}
		}
		if flags&flagPartition != 0 {
			v := d.varint()
			if v < -1<<31 || v > 1<<31-1 {
				d.fail("partition")
			}
			p := int32(v)
			env.Partition = &p
		}
		out = append(out, env)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, d.err
	}
	return out, nil
}

// logDecoder reads a record, keeping the first error.
type logDecoder struct {
	b   []byte
	err error
}

func (d *logDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: sqlstore: a log record's %s is invalid", driver.ErrCorrupt, what)
	}
	d.b = nil
}

func (d *logDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("length")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *logDecoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("number")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *logDecoder) int(what string) int {
	v := d.uvarint()
	if v > 1<<31-1 {
		d.fail(what)
		return 0
	}
	return int(v)
}

func (d *logDecoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("flags")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *logDecoder) take(n int) []byte {
	if len(d.b) < n {
		d.fail("id")
		return make([]byte, n)
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *logDecoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("length")
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

// DecodeLogMessage decodes the content of one of the log mode's logical decoding
// messages (prefix [Store.LogPrefix]) into the envelopes it carries, in the order
// they were sent, for a tool that reads the write-ahead log itself (a change data
// capture pipeline relaying the messages, or a test). Content of an unknown version,
// or corrupt, is an error wrapping [driver.ErrCorrupt]. The envelopes own their
// bytes: content may be reused after the call.
func DecodeLogMessage(content []byte) ([]*driver.Envelope, error) {
	return decodeLogRecord(append([]byte(nil), content...))
}
