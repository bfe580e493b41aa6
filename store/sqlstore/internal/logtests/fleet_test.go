package logtests

import (
	"testing"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/fleet"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// The fleet suite in log mode: the lease protocol over the table lane, with every
// relay also running the stream's reader (one reads, the others stand by). It runs on
// pgx alone: the lease statements are the same on database/sql, and the suite's
// timing checks want a machine that is not running it twice at once.
func TestFleetInLogMode(t *testing.T) {
	need(t)
	fleet.Run(t, outboxtest.StoreHarness{New: func(t *testing.T, buckets int) outboxtest.Store {
		return open(t, clients[0], sqlstore.Config{BucketCount: buckets})
	}})
}
