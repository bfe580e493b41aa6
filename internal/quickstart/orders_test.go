package quickstart_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/quickstart"
	"github.com/outboxkit/outbox/store/memstore"
)

// memOrders is the service's test double of its repository: it commits with the
// memory store's unit of work.
type memOrders struct {
	mu    sync.Mutex
	saved map[string]quickstart.Order
}

func (m *memOrders) Save(ctx context.Context, o quickstart.Order) error {
	return memstore.OnCommit(ctx, func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.saved[o.ID] = o
		return nil
	})
}

// The handler that runs on PostgreSQL in production, on the memory store: a declined
// order leaves no row and no message, a placed one both.
func TestPlaceOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	defer store.Close()
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	require.NoError(t, err)
	orders := &memOrders{saved: map[string]quickstart.Order{}}
	svc := quickstart.NewOrderService(store, sender, orders)

	admin := store.Driver().(driver.Admin)
	require.ErrorIs(t, svc.Place(ctx, quickstart.Order{ID: "declined", Amount: 0}), quickstart.ErrDeclined)
	stats, err := admin.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, make([]int, store.Driver().BucketCount()), stats.Pending, "nothing in the store")
	require.Empty(t, orders.saved, "no order saved")

	require.NoError(t, svc.Place(ctx, quickstart.Order{ID: "order-7", Amount: 30}))
	envs, err := admin.List(ctx, driver.Pending, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Len(t, envs, 1)
	require.Equal(t, "order-7", string(envs[0].Key))
	require.Contains(t, orders.saved, "order-7")
}
