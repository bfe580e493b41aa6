package outbox

import "context"

// Transactor runs a unit of work. Every store implements it.
//
// Transact runs fn in a transaction of the store. fn's ctx reaches the transaction
// (each store has typed accessors for its own handle: a pgx.Tx, a *sql.Tx, a
// *gorm.DB, DynamoDB items to add) and every send made with that ctx joins it,
// whatever the sender's [WriteMode]. If fn returns nil, the store writes the staged
// envelopes in the same transaction and commits: the application's writes and its
// messages persist together. If fn returns an error or panics, the transaction rolls
// back and nothing is written; the error is returned as is, the panic goes on.
//
// A Transact on a ctx that is already inside a unit of work of the same store joins
// it: fn runs in the outer transaction and its sends commit (or roll back) with it.
// A unit that writes nothing commits an empty transaction on every store.
type Transactor interface {
	Transact(ctx context.Context, fn func(ctx context.Context) error) error
}

// Tx is one store transaction as [RunTransaction] drives it. Store implementations
// provide it; applications never see it.
type Tx interface {
	// Commit writes envs (possibly none) in the transaction and commits it. It ends the
	// transaction whether it succeeds or not.
	Commit(ctx context.Context, envs []*Envelope) error
	// Rollback abandons the transaction. It is best effort: its ctx may be done.
	Rollback(ctx context.Context)
}

// unitKey finds the open unit of work of one store on a context.
type unitKey struct{ owner any }

// RunTransaction implements [Transactor.Transact] for a store, so every store has the
// same semantics. owner identifies the store (a pointer); begin starts a transaction
// and returns a ctx carrying the store's handle for its accessors.
//
// If ctx is inside an open unit of work of owner, fn joins it and begin is not
// called. Otherwise RunTransaction begins a transaction, opens a [Scope] on the ctx
// it passes to fn, and then commits the staged envelopes through the Tx, or rolls
// back if fn fails or panics. The scope ends with the unit: a send made with its ctx
// afterwards fails with [ErrClosed].
func RunTransaction(ctx context.Context, owner any, begin func(ctx context.Context) (context.Context, Tx, error), fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if outer, ok := ctx.Value(unitKey{owner}).(*Scope); ok && !outer.isEnded() {
		// Sends inside the joined function stage on the outer unit even when another
		// store's unit sits in between.
		return fn(context.WithValue(ctx, scopeKey{}, outer))
	}
	ctx, tx, err := begin(ctx)
	if err != nil {
		return err
	}
	scope := &Scope{owner: owner}
	ctx = context.WithValue(context.WithValue(ctx, scopeKey{}, scope), unitKey{owner}, scope)
	done := false
	defer func() {
		if !done { // fn panicked or called runtime.Goexit
			scope.end()
			tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := fn(ctx); err != nil {
		done = true
		scope.end()
		tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	done = true
	envs, _ := scope.end()
	return tx.Commit(ctx, envs)
}

func (s *Scope) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}
