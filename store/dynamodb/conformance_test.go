package dynamodb_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/chaos"
	dynamodb "github.com/outboxkit/outbox/store/dynamodb"
)

func harness() outboxtest.StoreHarness {
	return outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outbox.DispatchStore {
			return newTestDB(t).newStore(t, dynamodb.Options{BucketCount: bucketCount})
		},
		Transact: func(ctx context.Context, s outbox.DispatchStore, fn func(ctx context.Context) error) error {
			scope := outbox.ScopeFrom(ctx)
			if err := fn(ctx); err != nil {
				scope.Take()
				return err
			}
			if scope.Len() == 0 {
				return nil // Commit reports an empty unit of work; the suite expects a no-op
			}
			return s.(*dynamodb.Store).Commit(ctx)
		},
	}
}

func TestConformance(t *testing.T) {
	outboxtest.RunStoreTests(t, harness())
}

// TestChaos runs writers with rollbacks and a relay fleet under transport faults,
// graceful stops, crashes and a clock set back, over one table, and checks that every
// committed message is delivered, in order per key, and nothing rolled back is.
func TestChaos(t *testing.T) {
	t.Parallel()
	rep := chaos.Run(t, harness(), chaos.Config{
		Messages:    800,
		BucketCount: 8,
		Faults:      chaos.Schedule{Duration: 3 * time.Second},
	})
	require.Positive(t, rep.Committed)
	require.GreaterOrEqual(t, rep.Deliveries, rep.Committed)
}
