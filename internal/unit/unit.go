// Package unit is the one place a context carries units of work: the scopes that
// hold the sends staged for a transaction. The root package stages on them
// (capture, NewScope) and the driver package opens, nests and commits them
// (RunTransaction); both reach a scope through the single key here.
//
// It is generic over the staged item so that it depends on neither of them.
package unit

import (
	"context"
	"fmt"
	"sync"
)

// Scope buffers the items staged for one transaction (or one savepoint of it).
type Scope[T any] struct {
	// Owner is the store whose unit of work opened the scope; nil for a scope an
	// application opened for its own transaction.
	Owner any
	// Tx is the store's transaction object, for its accessors; nil for an
	// application's scope. A savepoint's scope shares its enclosing unit's.
	Tx any

	outer *Scope[T] // the scope that was innermost on the ctx this one was opened on

	mu     sync.Mutex
	staged []T
	ended  bool
	report func(n int) // told about items discarded at Release
}

type key struct{}

// Open returns a ctx whose innermost scope is s.
func Open[T any](ctx context.Context, s *Scope[T]) context.Context {
	s.outer = From[T](ctx)
	return context.WithValue(ctx, key{}, s)
}

// From returns the innermost scope on ctx, or nil.
func From[T any](ctx context.Context) *Scope[T] {
	s, _ := ctx.Value(key{}).(*Scope[T])
	return s
}

// Outer returns the scope that was innermost when s was opened, or nil.
func (s *Scope[T]) Outer() *Scope[T] { return s.outer }

// Find returns the innermost scope on ctx whose owner is owner (ended or not), or
// nil. owner must be of a comparable type.
func Find[T any](ctx context.Context, owner any) *Scope[T] {
	for s := From[T](ctx); s != nil; s = s.outer {
		if s.Owner != nil && s.Owner == owner {
			return s
		}
	}
	return nil
}

// Stage adds items. It fails with closed once the scope has ended. report, if the
// scope has none yet, is kept to be told about items discarded at Release.
func (s *Scope[T]) Stage(closed error, report func(int), items ...T) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		if s.Owner != nil {
			return fmt.Errorf("%w: the unit of work this ctx belongs to has ended; send inside the function given to Transact, before it returns", closed)
		}
		return fmt.Errorf("%w: send on a released scope", closed)
	}
	if s.report == nil {
		s.report = report
	}
	s.staged = append(s.staged, items...)
	return nil
}

// Len is the number of staged items.
func (s *Scope[T]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.staged)
}

// Take removes and returns every staged item, in staging order.
func (s *Scope[T]) Take() []T {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := s.staged
	s.staged = nil
	return items
}

// End closes the scope and returns what it still held, with its reporter.
func (s *Scope[T]) End() ([]T, func(int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := s.staged
	s.staged = nil
	s.ended = true
	return items, s.report
}

// Ended reports whether the scope has ended.
func (s *Scope[T]) Ended() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}
