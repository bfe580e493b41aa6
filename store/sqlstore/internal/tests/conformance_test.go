package tests

import (
	"testing"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// TestConformance runs the exported store suite on every database and client kind;
// its unit-of-work tests run through the store's own Transact.
func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunStoreTests(t, outboxtest.StoreHarness{
				New: func(t *testing.T, bucketCount int) outboxtest.Store {
					return b.open(t, sqlstore.Config{BucketCount: bucketCount})
				},
			})
		})
	}
}
