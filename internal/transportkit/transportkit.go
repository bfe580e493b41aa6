// Package transportkit is what the repository's transports (the modules under
// transport/) share beyond the [driver] contract: the frame of a Publish call and the
// *driver.PublishError it returns, the holding back of a key's later messages, the
// size check against Config.MaxMessageSize, the wording of constructor and
// configuration errors, and the decoding rules their consumers have in common. Third
// parties write transports against [driver] alone; nothing here is part of the
// contract.
//
// The transports are modules of their own that reach this package across modules
// (Go's internal rule goes by import path). Every module is released at one version,
// but an application may still build a transport against a newer root module than
// the transport's release required, so once a version is tagged, change what this
// package exports compatibly: add functions rather than change the ones released
// transports call.
package transportkit

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
)

// Publish is the frame of a transport's [driver.Transport] Publish. An empty batch
// publishes nothing and returns nil, and a ctx that has ended returns ctx's error,
// without calling send. Otherwise send publishes batch, recording in errs[i] why
// batch[i] failed and leaving it nil for an envelope the broker acknowledged. An
// error send returns means that nothing may be assumed sent (ctx ended, the broker
// could not be reached): Publish returns it as it is. Otherwise Publish returns nil
// when no envelope failed, and a [*driver.PublishError] naming, in batch order, those
// that did.
func Publish(ctx context.Context, batch []*driver.Envelope, send func(ctx context.Context, batch []*driver.Envelope, errs []error) error) error {
	if len(batch) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	errs := make([]error, len(batch))
	if err := send(ctx, batch, errs); err != nil {
		return err
	}
	var pe *driver.PublishError
	for i, err := range errs {
		if err != nil {
			if pe == nil {
				pe = &driver.PublishError{}
			}
			pe.Failed = append(pe.Failed, driver.MessageError{ID: batch[i].ID, Err: err})
		}
	}
	if pe == nil {
		return nil
	}
	return pe
}

// HoldBackTails reports every envelope of a key after the key's first failure in the
// batch as failed too, with heldBack, so that the relay never completes a key's later
// message while it retries (or parks) an earlier one: what a transport that sends a
// key's messages together must do to be a [driver.KeyOrderKeeper]. Keyless envelopes
// are left as they are.
func HoldBackTails(batch []*driver.Envelope, errs []error, heldBack error) {
	var failedKeys map[string]bool
	for i, env := range batch {
		if env.Key == nil {
			continue
		}
		switch {
		case errs[i] != nil:
			if failedKeys == nil {
				failedKeys = map[string]bool{}
			}
			failedKeys[string(env.Key)] = true
		case failedKeys[string(env.Key)]:
			errs[i] = heldBack
		}
	}
}

// CheckSize refuses, permanently and wrapping [outbox.ErrTooLarge], an envelope whose
// [outbox.Message.Size] exceeds limit, the transport's Config.MaxMessageSize; a limit
// of 0 is none. transport is the package's name, which starts the error.
func CheckSize(transport string, env *driver.Envelope, limit int) error {
	if size := env.Size(); limit > 0 && size > limit {
		return driver.Permanent(fmt.Errorf("%w: %s: message of %d bytes exceeds the transport's limit of %d (Config.MaxMessageSize)", outbox.ErrTooLarge, transport, size, limit))
	}
	return nil
}

// CheckArgs is what a constructor (New, NewSource) refuses first: when missing is set
// (the client or dialer it needs is nil), an error wrapping [outbox.ErrMisconfigured]
// that reads msg, which names the package and says what to pass; otherwise cfg's
// Validate error.
func CheckArgs(missing bool, msg string, cfg interface{ Validate() error }) error {
	if missing {
		return fmt.Errorf("%w: %s", outbox.ErrMisconfigured, msg)
	}
	return cfg.Validate()
}

// Positive is a Config.Validate check of a setting that may not be negative and
// takes a meaning of its own at 0: the error it returns for a negative v wraps
// [outbox.ErrMisconfigured] and reads "<transport>: <field> is <v>; it must be
// positive (or 0 for <zero>)".
func Positive[T ~int | ~int64](transport, field string, v T, zero string) error {
	if v < 0 {
		return fmt.Errorf("%w: %s: %s is %v; it must be positive (or 0 for %s)", outbox.ErrMisconfigured, transport, field, v, zero)
	}
	return nil
}

// Required is a Config.Validate check of a setting that has no default: the error
// it returns for an empty v wraps [outbox.ErrMisconfigured] and reads
// "<transport>: <field> is required", followed by " (<hint>)" when hint is set.
func Required(transport, field, v, hint string) error {
	switch {
	case v != "":
		return nil
	case hint != "":
		return fmt.Errorf("%w: %s: %s is required (%s)", outbox.ErrMisconfigured, transport, field, hint)
	}
	return fmt.Errorf("%w: %s: %s is required", outbox.ErrMisconfigured, transport, field)
}

// Between is a Config.Validate check of a setting the broker bounds: the error it
// returns for a v outside lo to hi wraps [outbox.ErrMisconfigured] and reads
// "<transport>: <field> is <v>; <bounds>", where bounds says what the broker takes.
func Between[T cmp.Ordered](transport, field string, v, lo, hi T, bounds string) error {
	if v < lo || v > hi {
		return fmt.Errorf("%w: %s: %s is %v; %s", outbox.ErrMisconfigured, transport, field, v, bounds)
	}
	return nil
}

// MessageID is the id a decoded message carries in its last [outbox.HeaderMessageID]
// header. Its error says that there is none or that it is not a UUID; a transport's
// Decode wraps it with [outbox.ErrInvalidMessage] and the broker's name for the
// message.
func MessageID(m *outbox.Message) (uuid.UUID, error) {
	raw, ok := m.Header(outbox.HeaderMessageID)
	if !ok {
		return uuid.Nil, fmt.Errorf("no %s header: it did not come through the outbox", outbox.HeaderMessageID)
	}
	id, err := uuid.ParseBytes(raw)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%s header %q: %w", outbox.HeaderMessageID, raw, err)
	}
	return id, nil
}

// OtherNames returns, sorted, the names in m that the transport does not reserve
// for itself: the header names of a message another producer published (or whose
// header order was lost), which a Decode then lists in name order.
func OtherNames[M ~map[string]V, V any](m M, reserved func(name string) bool) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		if !reserved(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// Payload is a decoded message's payload: nil for a tombstone, and otherwise the
// body, never nil, so that a consumer tells an empty payload from a tombstone.
func Payload(body []byte, tombstone bool) []byte {
	switch {
	case tombstone:
		return nil
	case body == nil:
		return []byte{}
	}
	return body
}

// Delivery is what a source hands the inbox consumer for raw, the broker's message,
// which its transport's Decode turned into id and m or failed to decode with err: a
// delivery the consumer rejects without running its handler ([inbox.Undecodable])
// when err is set.
func Delivery(raw any, id uuid.UUID, m outbox.Message, redelivered bool, err error) *inbox.Delivery {
	if err != nil {
		return inbox.Undecodable(raw, err)
	}
	return &inbox.Delivery{ID: id, Message: m, Redelivered: redelivered, Raw: raw}
}
