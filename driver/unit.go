package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/unit"
)

// Tx is one store transaction as [RunTransaction] drives it.
type Tx interface {
	// Commit writes envs (possibly none) in the transaction and commits it. It ends
	// the transaction whether it succeeds or not.
	Commit(ctx context.Context, envs []*Envelope) error
	// Rollback abandons the transaction. It is best effort: its ctx may be done.
	Rollback(ctx context.Context)
	// Savepoint marks the transaction's state for a nested unit of work: what the
	// application writes after it can be undone by the savepoint's Rollback.
	Savepoint(ctx context.Context) (Savepoint, error)
}

// Savepoint is a mark in a [Tx], taken for a nested unit of work.
type Savepoint interface {
	// Release keeps what was written since the mark, as part of the transaction.
	Release(ctx context.Context) error
	// Rollback undoes what was written since the mark; the transaction goes on.
	Rollback(ctx context.Context) error
}

// Unit describes a store's units of work to [RunTransaction].
type Unit struct {
	// Owner identifies the store: the handle a sender is built on (a pointer), so
	// that its sends find the store's units.
	Owner any
	// BucketCount stamps the envelopes the unit writes.
	BucketCount int
	// Begin starts a transaction.
	Begin func(ctx context.Context) (Tx, error)
}

// RunTransaction implements [outbox.Transactor.Transact] for a store, so every
// store has the same semantics.
//
// Outside any open unit of work of u.Owner, it begins a transaction, runs fn with a
// ctx that carries the unit (its sends stage on it; [TxFrom] finds the Tx), and then
// commits the staged messages as envelopes through the Tx, or rolls back if fn fails
// or panics. Messages already staged on an application's scope ([outbox.NewScope])
// that is the innermost on ctx join the unit: they commit or roll back with it. Inside one, it takes a [Savepoint] and runs fn as a nested unit: when fn
// fails or panics, the savepoint rolls back and fn's sends are dropped; when fn
// succeeds, the savepoint is released and its sends join the enclosing unit. A unit's
// ctx used after the unit ended cannot send ([outbox.ErrClosed]).
func RunTransaction(ctx context.Context, u Unit, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if outer := unit.Find[outbox.Message](ctx, u.Owner); outer != nil && !outer.Ended() {
		return nest(ctx, outer, fn)
	}
	tx, err := u.Begin(ctx)
	if err != nil {
		return err
	}
	scope := &unit.Scope[outbox.Message]{Owner: u.Owner, Tx: tx}
	// Sends staged on an application's own scope (outbox.NewScope) before this unit
	// began are written by it: nothing else would take them.
	if app := unit.From[outbox.Message](ctx); app != nil && app.Owner == nil {
		_ = scope.Stage(outbox.ErrClosed, nil, app.Take()...)
	}
	ctx = unit.Open(ctx, scope)
	done := false
	defer func() {
		if !done { // fn panicked or called runtime.Goexit
			scope.End()
			tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := fn(ctx); err != nil {
		done = true
		scope.End()
		tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	done = true
	msgs, _ := scope.End()
	envs, err := NewEnvelopes(msgs, u.BucketCount)
	if err != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx, envs)
}

// nest runs fn as a savepoint of outer.
func nest(ctx context.Context, outer *unit.Scope[outbox.Message], fn func(ctx context.Context) error) error {
	sp, err := outer.Tx.(Tx).Savepoint(ctx)
	if err != nil {
		return err
	}
	inner := &unit.Scope[outbox.Message]{Owner: outer.Owner, Tx: outer.Tx}
	ctx = unit.Open(ctx, inner)
	undo := func(cause error) error {
		inner.End()
		if err := sp.Rollback(context.WithoutCancel(ctx)); err != nil {
			return errors.Join(cause, fmt.Errorf("outbox: roll back the nested unit of work: %w", err))
		}
		return cause
	}
	done := false
	defer func() {
		if !done {
			_ = undo(nil)
		}
	}()
	if err := fn(ctx); err != nil {
		done = true
		return undo(err)
	}
	done = true
	msgs, _ := inner.End()
	if err := sp.Release(ctx); err != nil {
		return err
	}
	return outer.Stage(outbox.ErrClosed, nil, msgs...)
}

// NewEnvelopes builds pending envelopes for msgs with [NewEnvelope], for a store's
// writes of messages; an error names the message by its index. No messages give no
// envelopes.
func NewEnvelopes(msgs []outbox.Message, bucketCount int) ([]*Envelope, error) {
	if len(msgs) == 0 {
		return nil, nil
	}
	envs := make([]*Envelope, len(msgs))
	for i, m := range msgs {
		env, err := NewEnvelope(m, bucketCount)
		if err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		envs[i] = env
	}
	return envs, nil
}

// TxFrom returns the transaction of the innermost open unit of work on ctx whose
// [Tx] is a T: a store's typed accessors (sqlstore.PgxTx, say) are built on it. A
// nested unit's transaction is its enclosing unit's.
func TxFrom[T Tx](ctx context.Context) (T, bool) {
	for s := unit.From[outbox.Message](ctx); s != nil; s = s.Outer() {
		if tx, ok := s.Tx.(T); ok && !s.Ended() {
			return tx, true
		}
	}
	var zero T
	return zero, false
}

// InUnit reports whether ctx is inside an open unit of work of owner.
func InUnit(ctx context.Context, owner any) bool {
	s := unit.Find[outbox.Message](ctx, owner)
	return s != nil && !s.Ended()
}

// Take removes the messages staged on ctx's application scope ([outbox.NewScope])
// and returns them as envelopes for bucketCount, for a store's write into a
// transaction the application manages. It returns none when ctx has no such scope.
// If the transaction rolls back the messages are gone with it, as the application's
// own writes are.
func Take(ctx context.Context, bucketCount int) ([]*Envelope, error) {
	s := unit.From[outbox.Message](ctx)
	if s == nil || s.Owner != nil {
		return nil, nil
	}
	return NewEnvelopes(s.Take(), bucketCount)
}
