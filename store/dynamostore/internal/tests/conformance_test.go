package tests

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/chaos"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// harness runs the suite against the store's own unit of work, Store.Transact.
func harness() outboxtest.StoreHarness {
	return outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outboxtest.Store {
			return newTestDB(t).newStore(t, dynamostore.Config{BucketCount: bucketCount})
		},
		// A message's ID is not a key of its item: a held ID is not refused.
		AcceptsHeldIDs: true,
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
