package relay_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/fleet"
	"github.com/outboxkit/outbox/store/memstore"
)

func TestFleetOnTheMemoryStore(t *testing.T) {
	t.Parallel()
	fleet.Run(t, outboxtest.StoreHarness{New: func(t *testing.T, buckets int) outboxtest.Store {
		s, err := memstore.New(memstore.Config{BucketCount: buckets})
		require.NoError(t, err)
		return s
	}})
}
