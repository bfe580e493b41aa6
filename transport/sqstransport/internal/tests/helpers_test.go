package tests

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/memstore"
)

// pendingCount is how many messages the store holds pending.
func pendingCount(t *testing.T, store *memstore.Store) int {
	t.Helper()
	stats, err := store.Driver().(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	total := 0
	for _, p := range stats.Pending {
		total += p
	}
	return total
}
