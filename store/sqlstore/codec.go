package sqlstore

import (
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// flags records which nullable parts of a message are present, so nil and empty stay
// distinct on every driver (some return an empty BLOB as NULL or the reverse).
const (
	flagKey       = 1 << 0
	flagPayload   = 1 << 1
	flagHeaders   = 1 << 2
	flagPartition = 1 << 3
)

func messageFlags(m *outbox.Message) int64 {
	var f int64
	if m.Key != nil {
		f |= flagKey
	}
	if m.Payload != nil {
		f |= flagPayload
	}
	if m.Headers != nil {
		f |= flagHeaders
	}
	if m.Partition != nil {
		f |= flagPartition
	}
	return f
}

// micros stores a time as integer microseconds since the Unix epoch, so it
// round-trips exactly on every dialect; the zero time is 0.
func micros(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromMicros(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMicro(v).UTC()
}

// uuidValue scans a UUID stored natively (PostgreSQL: text or 16 bytes) or as
// BINARY(16)/BLOB.
type uuidValue struct{ id uuid.UUID }

func (u *uuidValue) Scan(src any) error {
	switch v := src.(type) {
	case string:
		id, err := uuid.Parse(v)
		u.id = id
		return err
	case []byte:
		if len(v) == 16 {
			copy(u.id[:], v)
			return nil
		}
		id, err := uuid.ParseBytes(v)
		u.id = id
		return err
	case [16]byte:
		u.id = v
		return nil
	}
	return fmt.Errorf("sqlstore: cannot scan %T into a message id", src)
}

// idArg is how a dialect binds a message id.
func idArg(d Dialect, id uuid.UUID) any {
	if d == PostgreSQL {
		return id.String()
	}
	return id[:]
}

// envelopeRow is one scanned row before it becomes an Envelope.
type envelopeRow struct {
	seq, bucket, bucketCount       int64
	id                             uuidValue
	topic                          string
	key, payload, headers          []byte
	part, flags, created, attempts int64
	next, status, dispatched       int64
	lastError                      string
}

func (r *envelopeRow) dest() []any {
	return []any{&r.seq, &r.id, &r.bucket, &r.bucketCount, &r.topic, &r.key, &r.payload, &r.headers,
		&r.part, &r.flags, &r.created, &r.attempts, &r.next, &r.status, &r.lastError, &r.dispatched}
}

func (r *envelopeRow) envelope() (*driver.Envelope, error) {
	env := &driver.Envelope{
		Bucket:        int(r.bucket),
		BucketCount:   int(r.bucketCount),
		Seq:           r.seq,
		CreatedAt:     fromMicros(r.created),
		Attempts:      int(r.attempts),
		NextAttemptAt: fromMicros(r.next),
		Status:        driver.Status(r.status),
		LastError:     r.lastError,
		DispatchedAt:  fromMicros(r.dispatched),
	}
	env.ID = r.id.id
	env.Topic = r.topic
	if r.flags&flagKey != 0 {
		env.Key = nonNil(r.key)
	}
	if r.flags&flagPayload != 0 {
		env.Payload = nonNil(r.payload)
	}
	if r.flags&flagHeaders != 0 {
		hs, err := driver.DecodeHeaders(r.headers)
		if err != nil {
			return nil, fmt.Errorf("%w (message %s)", err, env.ID)
		}
		env.Headers = hs
	}
	if r.flags&flagPartition != 0 {
		p := int32(r.part)
		env.Partition = &p
	}
	return env, nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// scanEnvelopes reads every row and closes rs.
func scanEnvelopes(rs rows) ([]*driver.Envelope, error) {
	defer rs.Close()
	var out []*driver.Envelope
	for rs.Next() {
		var r envelopeRow
		if err := rs.Scan(r.dest()...); err != nil {
			return nil, err
		}
		env, err := r.envelope()
		if err != nil {
			return nil, err
		}
		out = append(out, env)
	}
	return out, rs.Err()
}

// truncateError makes a cause storable in a text column on every dialect (valid
// UTF-8, no NUL byte, which PostgreSQL refuses) and keeps it bounded, cutting on a
// rune boundary. A cause the column refused would leave its message unparkable.
func truncateError(s string) string {
	const max = 2000
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && s[cut]&0xC0 == 0x80 {
		cut--
	}
	return s[:cut]
}
