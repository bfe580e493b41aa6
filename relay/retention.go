package relay

import (
	"context"

	"github.com/outboxkit/outbox/driver"
)

// retention deletes dispatched envelopes older than Config.Retention, in bounded
// batches, while this relay holds bucket 0 (so one relay of the fleet does it).
type retention struct {
	cfg      *Config
	retainer driver.Retainer // nil: Retention is off
	leases   *leaseTable
	meter    *meter
}

// cleanup runs one bounded cleanup and returns how many envelopes it deleted.
func (r *retention) cleanup(ctx context.Context) (int, error) {
	if r.cfg.Retention <= 0 || !r.leases.publishable(0, r.cfg.now()) {
		return 0, nil
	}
	before := r.cfg.now().Add(-r.cfg.Retention)
	total := 0
	for range retentionRounds {
		n, err := r.retainer.DeleteDispatched(ctx, before, retentionBatch)
		total += n
		r.meter.retentionDeleted(ctx, n)
		if err != nil {
			return total, err
		}
		if n < retentionBatch {
			break
		}
	}
	return total, nil
}
