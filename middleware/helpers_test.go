package middleware_test

// Temporary stand-ins until store/memory and outboxtest.Recorder land.

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/outboxkit/outbox"
)

type tmpStore struct {
	mu     sync.Mutex
	envs   []*outbox.Envelope
	closed bool
	limit  int
}

func (s *tmpStore) BucketCount() int { return outbox.DefaultBucketCount }
func (s *tmpStore) Enqueue(ctx context.Context, envs ...*outbox.Envelope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return outbox.ErrClosed
	}
	for _, e := range envs {
		s.envs = append(s.envs, e.Clone())
	}
	return nil
}
func (s *tmpStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

type limitedStore struct{ *tmpStore }

func (s limitedStore) MaxMessageSize() int { return s.limit }

func newStore(t *testing.T) outbox.Store { return &tmpStore{} }
func newLimitedStore(t *testing.T, limit int) outbox.Store {
	return limitedStore{&tmpStore{limit: limit}}
}

func stored(t *testing.T, s outbox.Store) []*outbox.Envelope {
	var ts *tmpStore
	switch v := s.(type) {
	case *tmpStore:
		ts = v
	case limitedStore:
		ts = v.tmpStore
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.envs)
}

type tmpRecorder struct {
	mu   sync.Mutex
	envs []*outbox.Envelope
}

func (r *tmpRecorder) Publish(_ context.Context, batch []*outbox.Envelope) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range batch {
		r.envs = append(r.envs, e.Clone())
	}
	return nil
}

func newRecorder(t *testing.T) *tmpRecorder { return &tmpRecorder{} }
func recorded(t *testing.T, r *tmpRecorder) []*outbox.Envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.envs)
}

type failingTransport struct{ err error }

func (f failingTransport) Publish(context.Context, []*outbox.Envelope) error { return f.err }
