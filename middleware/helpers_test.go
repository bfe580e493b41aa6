package middleware_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/memory"
)

// newStore returns an empty memory store, closed when the test ends.
func newStore(t *testing.T) *memory.Store {
	t.Helper()
	return newStoreWith(t, memory.Config{})
}

// newLimitedStore returns a memory store that refuses messages over limit bytes.
func newLimitedStore(t *testing.T, limit int) *memory.Store {
	t.Helper()
	return newStoreWith(t, memory.Config{MaxMessageSize: limit})
}

func newStoreWith(t *testing.T, cfg memory.Config) *memory.Store {
	t.Helper()
	s, err := memory.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// stored returns every pending envelope in the store, by bucket then Seq.
func stored(t *testing.T, s *memory.Store) []*outbox.Envelope {
	t.Helper()
	envs, err := s.List(t.Context(), outbox.Pending, outbox.Cursor{}, 1000)
	require.NoError(t, err)
	return envs
}
