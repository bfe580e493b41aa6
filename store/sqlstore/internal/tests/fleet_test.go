package tests

import (
	"testing"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/fleet"
	"github.com/outboxkit/outbox/store/sqlstore"
)

func TestFleet(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			fleet.Run(t, outboxtest.StoreHarness{New: func(t *testing.T, buckets int) outboxtest.Store {
				return b.open(t, sqlstore.Config{BucketCount: buckets})
			}})
		})
	}
}
