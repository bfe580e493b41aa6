package sqlstore_test

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	sqlstore "github.com/outboxkit/outbox/store/sql"
)

// TestConformance runs the exported store suite on every database and client kind.
func TestConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunStoreTests(t, outboxtest.StoreHarness{
				New: func(t *testing.T, bucketCount int) outbox.DispatchStore {
					return b.open(t, sqlstore.Config{BucketCount: bucketCount})
				},
				Transact: func(ctx context.Context, s outbox.DispatchStore, fn func(ctx context.Context) error) error {
					return b.transact(ctx, s.(*sqlstore.Store), func(ctx context.Context, _ execFunc) error { return fn(ctx) })
				},
			})
		})
	}
}
