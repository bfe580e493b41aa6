// Package outbox is a storage-agnostic transactional outbox: an application's state
// change and the messages it sends commit together, and a relay
// ([github.com/outboxkit/outbox/relay]) publishes the messages to a broker afterwards.
//
// An application holds two small interfaces: a [Transactor] (every store is one) and
// a [Sender] ([NewSender] captures into a store):
//
//	err := store.Transact(ctx, func(ctx context.Context) error {
//		if err := saveOrder(ctx, order); err != nil { // reaches the store's tx from ctx
//			return err
//		}
//		return sender.Send(ctx, outbox.Message{Topic: "order-placed", Key: key, Payload: body})
//	})
//
// A send made with fn's ctx is staged on the unit of work and written in the same
// transaction when fn returns nil; if fn fails or panics, nothing is written. A
// Transact inside another of the same store is a savepoint: when it fails, its writes
// and its sends are undone and the outer unit goes on. A send made outside any unit
// of work fails with [ErrNoTransaction], unless the sender's mode is [Immediate].
//
// This package is what applications use: messages, senders, units of work, write
// modes and errors. Stores and transports implement the contract in
// [github.com/outboxkit/outbox/driver]; applications do not import it.
//
// # Semantics
//
//   - Delivery is at least once. A message can be published more than once (a relay
//     crashes after the broker acknowledged it but before the store forgot it, or a lease
//     moves while a publish is in flight); consumers deduplicate on the message ID
//     ([HeaderMessageID], and [HeaderIdempotencyKey] unless the application set one).
//   - Order is kept per key: messages with one key are relayed one at a time, in the
//     order the store assigned. For writers that serialise their writes to a key, that
//     is commit order.
//   - Keys, payloads and headers are bytes. Nothing in the relay path serialises or
//     re-encodes them.
//
// # Limitations
//
//   - An Immediate send outside a unit of work is durable but not atomic with any
//     write of the application's: the message and the state are two writes.
//   - Two uncoordinated transactions that write the same key have no defined order.
//   - Lease expiry compares host clocks; keep relay hosts synchronised to well within the
//     lease duration.
package outbox

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Header names the outbox reads or stamps.
const (
	// HeaderMessageID carries the message's ID ([Message.ID]) on every published
	// message.
	HeaderMessageID = "x-outbox-message-id"
	// HeaderIdempotencyKey is stamped by the transports at publish with the message ID
	// unless the application set one; consumers deduplicate on it.
	HeaderIdempotencyKey = "idempotency-key"
	// HeaderCorrelationID carries a correlation id across hops.
	HeaderCorrelationID = "x-correlation-id"
)

// Header is one message header. Headers are ordered and a key may repeat, as in Kafka.
type Header struct {
	Key   string
	Value []byte
}

// Message is what an application sends.
type Message struct {
	// ID identifies the message end to end: it is the [HeaderMessageID] header on the
	// broker (and the idempotency key unless a header sets one). Leave it zero and
	// the capture draws a UUIDv7; set it (from uuid.NewV7, or an id of the
	// application's own, such as an event id) to know it before sending. The SQL and
	// memory stores refuse a second message with an ID they hold; DynamoDB does not
	// check (consumers deduplicate on the ID, as they do for every redelivery).
	ID uuid.UUID
	// Topic names the destination: a Kafka topic, or a name a transport resolves to a
	// queue. Required.
	Topic string
	// Key orders messages: messages with one key are delivered in order. A nil key is
	// keyless; an empty, non-nil key is a real empty key.
	Key []byte
	// Payload is the message body. A nil payload is a tombstone.
	Payload []byte
	// Headers travel with the message in order.
	Headers []Header
	// Partition optionally pins the message to a Kafka partition. It also decides the
	// bucket (partition modulo the bucket count).
	Partition *int32
}

// Header returns the value of the last header named key, and whether there was one.
func (m *Message) Header(key string) ([]byte, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == key {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// Size is the number of bytes the message occupies: topic, key, payload and headers.
// Stores and transports compare it with their limits.
func (m *Message) Size() int {
	n := len(m.Topic) + len(m.Key) + len(m.Payload)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return n
}

// Validate reports whether the message can be captured.
func (m *Message) Validate() error {
	if m.Topic == "" {
		return fmt.Errorf("%w: message has no topic", ErrInvalidMessage)
	}
	if !validText(m.Topic) {
		return fmt.Errorf("%w: topic %q is not valid UTF-8 or holds a NUL byte", ErrInvalidMessage, m.Topic)
	}
	if m.Partition != nil && *m.Partition < 0 {
		return fmt.Errorf("%w: partition %d is negative", ErrInvalidMessage, *m.Partition)
	}
	for i, h := range m.Headers {
		if h.Key == "" {
			return fmt.Errorf("%w: header %d has an empty key", ErrInvalidMessage, i)
		}
		if !validText(h.Key) {
			return fmt.Errorf("%w: header key %q is not valid UTF-8 or holds a NUL byte", ErrInvalidMessage, h.Key)
		}
	}
	return nil
}

// validText reports whether s can be stored as text by every store: valid UTF-8
// with no NUL byte (PostgreSQL refuses both).
func validText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, 0)
}

// WriteMode says what a send made outside any unit of work does. Inside a unit of
// work ([Transactor.Transact]) every send joins the transaction, whatever the mode.
type WriteMode int

const (
	// Transactional refuses a send made outside a unit of work with [ErrNoTransaction]:
	// a message is written only together with the application's own write, so a
	// forgotten Transact is an error at Send, never a silent non-atomic write. The
	// default.
	Transactional WriteMode = iota
	// Immediate writes a send made outside a unit of work straight to the store with
	// [Store.Enqueue]: durable before Send returns, but not atomic with any write of
	// the application's. For sends that have no state change to go with.
	Immediate
)

func (m WriteMode) String() string {
	switch m {
	case Immediate:
		return "immediate"
	case Transactional:
		return "transactional"
	}
	return fmt.Sprintf("WriteMode(%d)", int(m))
}

// Sentinel errors. Adapters wrap them with %w; test with errors.Is.
var (
	// ErrNoTransaction: a Transactional send was made outside any unit of work.
	ErrNoTransaction = errors.New("outbox: transactional send outside a unit of work: send with the ctx that Transact passes to its function (not the ctx Transact was called with), or use outbox.Immediate for sends that need no transaction")
	// ErrMisconfigured: settings disagree (bucket counts, options, missing tables); the
	// relay refuses to start or stops.
	ErrMisconfigured = errors.New("outbox: misconfigured")
	// ErrClosed: the store, scope, unit of work or relay was closed or has ended.
	ErrClosed = errors.New("outbox: closed")
	// ErrInvalidMessage: the message cannot be captured (no topic, a topic or header
	// key that is not valid UTF-8 or holds NUL, too large, ...). Nothing was written.
	ErrInvalidMessage = errors.New("outbox: invalid message")
	// ErrTooLarge: a message or unit of work exceeds a store or transport limit.
	// errors.Is(err, ErrInvalidMessage) holds for it too. Nothing was written.
	ErrTooLarge error = tooLarge{}
)

type tooLarge struct{}

func (tooLarge) Error() string { return "outbox: too large" }
func (tooLarge) Unwrap() error { return ErrInvalidMessage }
