package dynamodb_test

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	dynamodb "github.com/outboxkit/outbox/store/dynamodb"
)

func TestConformance(t *testing.T) {
	outboxtest.RunStoreTests(t, outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outbox.RelayStore {
			return newTestDB(t).newStore(t, dynamodb.Options{BucketCount: bucketCount})
		},
		Transact: func(ctx context.Context, s outbox.RelayStore, fn func(ctx context.Context) error) error {
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
	})
}
