package outbox

import (
	"context"

	"github.com/outboxkit/outbox/internal/unit"
)

// Scope carries sends to a transaction the application commits itself, instead of a
// store's [Transactor.Transact]. Sends made with the ctx of [NewScope] stage their
// messages on it; the store's write call for the application's transaction
// (sqlstore's EnqueueTx or EnqueuePgxTx, dynamostore's CreateTransactWriteItems) takes them. A Scope is
// safe for concurrent use.
type Scope struct{ s *unit.Scope[Message] }

// NewScope returns a context carrying a new, empty scope, for an application that
// commits its own transaction: send with the returned ctx, write the staged messages
// into the transaction with the store's call for it, commit, then Release the scope.
// Inside a store's Transact no scope is needed: the unit of work opens its own.
func NewScope(ctx context.Context) (context.Context, *Scope) {
	s := &unit.Scope[Message]{}
	return unit.Open(ctx, s), &Scope{s}
}

// Len is the number of messages staged and not yet taken by a write.
func (s *Scope) Len() int { return s.s.Len() }

// Release ends the scope: later sends on it fail with [ErrClosed]. Messages still
// staged were never taken by any transaction; they are discarded and reported at
// WARN through the logger of the sender that staged them. Release returns how many it
// discarded; calling it twice is harmless.
func (s *Scope) Release() int {
	msgs, report := s.s.End()
	if n := len(msgs); n > 0 && report != nil {
		report(n)
	}
	return len(msgs)
}
