package logtests

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// PostgreSQL killed mid-stream (pg_ctl stop -m immediate: no checkpoint, as a crash)
// and started again: every message whose unit of work committed is published, first
// deliveries in key order, while writers and the relay ride through the outage.
func TestPostgresKilledMidStream(t *testing.T) {
	need(t)
	c := pgcluster.Start(t, pgcluster.Logical)
	ctx := testContext(t)
	own, err := pgxpool.New(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer own.Close()
	s, err := sqlstore.NewPgx(own, sqlstore.Config{Mode: sqlstore.LogMode, Logger: quietLog})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	defer s.Close()

	rec := outboxtest.NewRecorder()
	cfg := fastRelay("survivor")
	cfg.StoreTimeout = 500 * time.Millisecond
	startRelay(t, s, rec, cfg)

	// Writers: each key's units one after the other; a unit whose commit failed is
	// of unknown outcome and left out of the check.
	const perKey = 150
	ks := keys(4)
	acked := make(map[string][]string)
	var mu sync.Mutex
	var written atomic.Int64
	var wg sync.WaitGroup
	snd := sender(t, s, outbox.Transactional)
	for _, k := range ks {
		wg.Go(func() {
			for i := range perKey {
				m := message(k, i)
				err := s.Transact(ctx, func(ctx context.Context) error { return snd.Send(ctx, m) })
				if err != nil {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				written.Add(1)
				mu.Lock()
				acked[k] = append(acked[k], string(m.Payload))
				mu.Unlock()
			}
		})
	}
	for written.Load() < int64(len(ks)*perKey/3) {
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, c.Stop("immediate"))
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, c.Restart())
	wg.Wait()

	total := 0
	for _, k := range ks {
		total += len(acked[k])
	}
	require.Greater(t, total, len(ks)*perKey/3, "writes went on after the restart")
	// Every acknowledged unit's message is published.
	require.Eventually(t, func() bool {
		got := map[string]bool{}
		for _, e := range rec.Messages() {
			got[string(e.Payload)] = true
		}
		for _, k := range ks {
			for _, p := range acked[k] {
				if !got[p] {
					return false
				}
			}
		}
		return true
	}, 2*time.Minute, 50*time.Millisecond)
	// First deliveries of the acknowledged ones are in the order sent.
	byKey := rec.ByKey()
	for _, k := range ks {
		want := map[string]bool{}
		for _, p := range acked[k] {
			want[p] = true
		}
		var got []string
		for _, e := range byKey[k] {
			if want[string(e.Payload)] {
				got = append(got, string(e.Payload))
			}
		}
		require.Equal(t, acked[k], got, "key %s", k)
	}
	t.Logf("%d acknowledged units, %d deliveries, %d duplicates", total, rec.Len(), rec.Duplicates())
}
