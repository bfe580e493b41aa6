package logtests

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// relaySide is every capability the store's relay side offers.
type relaySide interface {
	driver.Store
	driver.Admin
	driver.Notifier
	driver.Finder
	driver.Retainer
	inbox.Store
	inbox.Remover
}

// laneStore is a log-mode store whose relay side moves what its slot holds into the
// table lane before each Fetch, so the store suite's checks of what a unit of work
// wrote (which read rows) run against the table lane.
type laneStore struct {
	*sqlstore.Store
	lane *laneDriver
}

func (l laneStore) Driver() driver.Store { return l.lane }

// Unwrap lets senders built on the wrapper find the store's units of work.
func (l laneStore) Unwrap() outbox.Store { return l.Store }

type laneDriver struct {
	relaySide
	s  *sqlstore.Store
	mu sync.Mutex
}

// lane wraps a log-mode store so its Fetch reads what the slot holds.
func lane(t testing.TB, s *sqlstore.Store) laneStore {
	rs, ok := s.Driver().(relaySide)
	require.True(t, ok)
	return laneStore{Store: s, lane: &laneDriver{relaySide: rs, s: s}}
}

// Fetch implements driver.Queue: the slot's committed messages go to the table, then
// the table is read.
func (d *laneDriver) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	if err := d.pump(ctx); err != nil && !errors.Is(err, outbox.ErrClosed) && ctx.Err() == nil {
		return driver.Batch{}, err
	}
	return d.relaySide.Fetch(ctx, bucket, limit)
}

// pump consumes the slot up to now with pg_logical_slot_get_binary_changes (what a
// reader would get, synchronously) and writes the store's messages to the table.
func (d *laneDriver) pump(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	cfg := d.s.Config()
	rows, err := pool.Query(ctx, "SELECT data FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2, 'messages', 'true')", cfg.Slot, cfg.Publication)
	if err != nil {
		return err
	}
	var envs []*driver.Envelope
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			rows.Close()
			return err
		}
		if len(data) == 0 || data[0] != 'M' {
			continue
		}
		m, err := pglogrepl.Parse(data)
		if err != nil {
			rows.Close()
			return err
		}
		ldm := m.(*pglogrepl.LogicalDecodingMessage)
		if !ldm.Transactional || ldm.Prefix != d.s.LogPrefix() {
			continue
		}
		got, err := sqlstore.DecodeLogMessage(ldm.Content)
		if err != nil {
			rows.Close()
			return err
		}
		envs = append(envs, got...)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	return d.relaySide.Enqueue(ctx, envs...)
}

// The store suite in log mode: the relay side (the table lane, leases, admin) as in
// table mode, and the units of work through the slot, moved to the table lane to be
// read. Only the refusal of an ID the store holds does not apply.
func TestConformanceInLogMode(t *testing.T) {
	eachClient(t, func(t *testing.T, c client) {
		outboxtest.RunStoreTests(t, outboxtest.StoreHarness{
			New: func(t *testing.T, bucketCount int) outboxtest.Store {
				return lane(t, open(t, c, sqlstore.Config{BucketCount: bucketCount}))
			},
			// The log has no unique index: a message whose ID the store holds is
			// written again (the relay then publishes it twice, as at-least-once allows).
			AcceptsHeldIDs: true,
		})
	})
}
