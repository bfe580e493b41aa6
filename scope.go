package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
)

// Scope is the buffer that carries Transactional sends from capture to a store's unit
// of work. It lives on a context: open one per request or per unit of work with
// [NewScope]; the capture middleware stages envelopes on it; the unit of work takes
// them and writes them in the application's transaction.
//
// A Scope is safe for concurrent use.
type Scope struct {
	mu       sync.Mutex
	staged   []*Envelope
	released bool
}

type scopeKey struct{}

// abandoned counts envelopes discarded by Release without a commit, process-wide.
var abandoned atomic.Int64

// NewScope returns a context carrying a new, empty scope, and the scope. Release it
// when the request ends (defer scope.Release()).
func NewScope(ctx context.Context) (context.Context, *Scope) {
	s := &Scope{}
	return context.WithValue(ctx, scopeKey{}, s), s
}

// ScopeFrom returns the scope on ctx, or nil.
func ScopeFrom(ctx context.Context) *Scope {
	s, _ := ctx.Value(scopeKey{}).(*Scope)
	return s
}

// Stage buffers envelopes for the next unit of work. It fails with [ErrClosed] after
// Release.
func (s *Scope) Stage(envs ...*Envelope) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		return fmt.Errorf("%w: stage on a released scope", ErrClosed)
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

// Take removes and returns every staged envelope, in staging order. A unit of work
// calls it inside its transaction: if the transaction rolls back, the envelopes are
// gone with it, just as the application's own write is. An application that retries
// its transaction sends again in the retried attempt.
//
// Units of work do not nest on one scope: an inner one would take, and commit, what
// the outer one staged, even if the outer transaction later rolls back. Give a nested
// transaction its own scope (NewScope on its context) or send only from the outer one.
func (s *Scope) Take() []*Envelope {
	s.mu.Lock()
	defer s.mu.Unlock()
	envs := s.staged
	s.staged = nil
	return envs
}

// Release closes the scope. Envelopes still staged were never committed by any unit of
// work — a send was captured in Transactional mode but nothing wrote it — so they are
// discarded, logged at warning level and counted ([AbandonedEnvelopes]). Releasing an
// empty scope, or a scope whose unit of work failed, is quiet. Release returns the
// number discarded; calling it twice is harmless.
func (s *Scope) Release() int {
	s.mu.Lock()
	n := len(s.staged)
	s.staged = nil
	s.released = true
	s.mu.Unlock()
	if n > 0 {
		abandoned.Add(int64(n))
		slog.Warn("outbox: scope released with staged envelopes that no unit of work committed; they are discarded",
			"envelopes", n)
	}
	return n
}

// AbandonedEnvelopes is the process-wide count of staged envelopes discarded by
// [Scope.Release] without a commit. A growing value means a Transactional route whose
// handler never commits through a unit of work.
func AbandonedEnvelopes() int64 { return abandoned.Load() }
