package logtests

import (
	"testing"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/fleet"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// The fleet suite in log mode: the lease protocol over the table lane, with every
// relay also running the stream's reader (one reads, the others stand by).
func TestFleetInLogMode(t *testing.T) {
	eachClient(t, func(t *testing.T, c client) {
		fleet.Run(t, outboxtest.StoreHarness{New: func(t *testing.T, buckets int) outboxtest.Store {
			return open(t, c, sqlstore.Config{BucketCount: buckets})
		}})
	})
}
