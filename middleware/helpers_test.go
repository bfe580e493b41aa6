package middleware_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/memstore"
)

// newStore returns an empty memory store, closed when the test ends.
func newStore(t *testing.T) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// newSender returns the capture into store with cfg.
func newSender(t *testing.T, store outbox.Store, cfg outbox.SenderConfig) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(store, cfg)
	require.NoError(t, err)
	return c
}

// stored returns every pending envelope in the store, by bucket then Seq.
func stored(t *testing.T, s *memstore.Store) []*driver.Envelope {
	t.Helper()
	envs, err := s.Driver().(driver.Admin).List(t.Context(), driver.Pending, driver.Cursor{}, 1000)
	require.NoError(t, err)
	return envs
}

// headerCount counts the headers named key.
func headerCount(env *driver.Envelope, key string) int {
	n := 0
	for _, h := range env.Headers {
		if h.Key == key {
			n++
		}
	}
	return n
}
