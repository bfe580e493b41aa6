package outbox

import (
	"context"
	"fmt"
	"sync"
)

// Scope is the buffer that carries sends from capture to the transaction that writes
// them. Every unit of work ([Transactor.Transact]) opens one for its function's ctx;
// sends made with that ctx stage their envelopes on it, and the store writes them in
// its transaction when the function returns nil.
//
// Applications meet a Scope only when they run their own transaction instead of a
// store's Transact (see [NewScope]). A Scope is safe for concurrent use.
type Scope struct {
	owner any // the store whose unit of work opened the scope; nil for NewScope

	mu     sync.Mutex
	staged []*Envelope
	ended  bool
	// report is told about envelopes a manual scope discards at Release; it is set
	// by the first capture that stages on the scope.
	report func(n int)
}

type scopeKey struct{}

// NewScope returns a context carrying a new, empty scope, for an application that
// commits its own transaction: send with the returned ctx, write the staged envelopes
// into the transaction with the store's EnqueueTx-style call (which takes them from
// the scope), commit, then Release the scope. Inside a store's [Transactor.Transact]
// no scope is needed: the unit of work opens its own.
//
// Release reports envelopes that were staged and never taken through the logger of
// the [Capture] that staged them.
func NewScope(ctx context.Context) (context.Context, *Scope) {
	s := &Scope{}
	return context.WithValue(ctx, scopeKey{}, s), s
}

// ScopeFrom returns the innermost scope on ctx, or nil.
func ScopeFrom(ctx context.Context) *Scope {
	s, _ := ctx.Value(scopeKey{}).(*Scope)
	return s
}

// stage buffers envelopes for the transaction. It fails once the scope ended.
func (s *Scope) stage(report func(int), envs ...*Envelope) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		if s.owner != nil {
			return fmt.Errorf("%w: the unit of work this ctx belongs to has ended; send inside the function given to Transact, before it returns", ErrClosed)
		}
		return fmt.Errorf("%w: send on a released scope", ErrClosed)
	}
	if s.report == nil {
		s.report = report
	}
	s.staged = append(s.staged, envs...)
	return nil
}

// Len is the number of staged envelopes.
func (s *Scope) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.staged)
}

// Take removes and returns every staged envelope, in staging order. A store calls it
// inside the transaction that writes them: if the transaction rolls back, the
// envelopes are gone with it, as the application's own write is. An application that
// retries its transaction sends again in the retried attempt.
func (s *Scope) Take() []*Envelope {
	s.mu.Lock()
	defer s.mu.Unlock()
	envs := s.staged
	s.staged = nil
	return envs
}

// Release ends the scope: later sends on it fail with [ErrClosed]. Envelopes still
// staged were never taken by any transaction; they are discarded, reported through
// the logger of the capture that staged them, and counted ([Capture.Abandoned]).
// Release returns how many it discarded; calling it twice is harmless.
func (s *Scope) Release() int {
	envs, report := s.end()
	if n := len(envs); n > 0 && report != nil {
		report(n)
	}
	return len(envs)
}

// end closes the scope and returns what it still held.
func (s *Scope) end() ([]*Envelope, func(int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	envs := s.staged
	s.staged = nil
	s.ended = true
	return envs, s.report
}
