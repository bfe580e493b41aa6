package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Transport publishes envelopes to a broker.
type Transport interface {
	// Publish sends a batch and returns nil only when the broker durably acknowledged
	// every message. Otherwise it returns a [*PublishError] naming the messages that
	// failed (the others were acknowledged), or any other error meaning none may be
	// assumed sent. Wrap permanent causes with [Permanent]. Every message must carry
	// the [outbox.HeaderMessageID] header. Keys, payloads and headers pass through unchanged.
	Publish(ctx context.Context, batch []*Envelope) error
}

// KeyOrderKeeper is implemented by transports that never acknowledge an envelope
// after failing an earlier envelope of the same key in the same Publish call (they
// fail the key's whole tail). For them the relay puts several envelopes of one
// key in one call; for other transports a call carries at most one envelope per key,
// so that a failure can still hold back its key's later envelopes.
type KeyOrderKeeper interface {
	KeepsKeyOrder() bool
}

// Pinger is implemented by transports that can check, without publishing, that they
// reach their broker. A relay whose publishes keep failing asks it whether the
// broker or the messages are at fault: a relay that cannot reach its broker for
// longer than a lease hands its buckets to peers that can, and parks nothing for
// attempts it made while cut off. Ping returns nil when the broker answers, and
// ctx's error once ctx has ended.
type Pinger interface {
	Ping(ctx context.Context) error
}

// PublishError reports which messages of a batch failed.
type PublishError struct {
	Failed []MessageError
}

// MessageError is one message's failure.
type MessageError struct {
	ID  uuid.UUID
	Err error
}

func (e *PublishError) Error() string {
	if len(e.Failed) == 1 {
		return fmt.Sprintf("outbox: publish %s: %v", e.Failed[0].ID, e.Failed[0].Err)
	}
	return fmt.Sprintf("outbox: publish: %d messages failed, first %s: %v", len(e.Failed), e.Failed[0].ID, e.Failed[0].Err)
}

// Unwrap exposes every cause to errors.Is and errors.As.
func (e *PublishError) Unwrap() []error {
	errs := make([]error, len(e.Failed))
	for i, f := range e.Failed {
		errs[i] = f.Err
	}
	return errs
}

// permanentError marks a failure that retrying cannot fix.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks err as a failure that retrying cannot fix (message too large, unknown
// destination, not authorised): the relay parks the message at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanentError{err}
}

// IsPermanent reports whether err, or an error it wraps, was marked [Permanent].
func IsPermanent(err error) bool {
	var p permanentError
	return errors.As(err, &p)
}

// PublishTimeouter is implemented by transports whose Publish may wait up to a fixed
// time for the broker (an acknowledgement timeout). A relay checks when it is built
// that such a publish can finish inside a lease, and refuses timings where it cannot.
type PublishTimeouter interface {
	// PublishTimeout is the longest a Publish call waits for the broker.
	PublishTimeout() time.Duration
}
