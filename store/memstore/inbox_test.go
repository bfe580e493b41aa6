package memstore_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// effects is an application's state on a memory store: effects per key, changed
// only through memstore.OnCommit, so it commits with the unit or not at all.
type effects struct {
	mu sync.Mutex
	n  map[string]int
}

func TestInboxConformance(t *testing.T) {
	var mu sync.Mutex
	state := map[outboxtest.Store]*effects{}
	outboxtest.RunInboxTests(t, outboxtest.InboxHarness{
		New: func(t *testing.T) outboxtest.Store {
			st, err := memstore.New(memstore.Config{BucketCount: 1})
			require.NoError(t, err)
			mu.Lock()
			state[st] = &effects{n: map[string]int{}}
			mu.Unlock()
			return st
		},
		Effect: func(ctx context.Context, st outboxtest.Store, key string) error {
			mu.Lock()
			e := state[st]
			mu.Unlock()
			return memstore.OnCommit(ctx, func() error {
				e.mu.Lock()
				defer e.mu.Unlock()
				e.n[key]++
				return nil
			})
		},
		Effects: func(t *testing.T, st outboxtest.Store, key string) int {
			mu.Lock()
			e := state[st]
			mu.Unlock()
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.n[key]
		},
	})
}
