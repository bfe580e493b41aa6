package sqlstore

import (
	"context"
	"sync"
	"time"
)

// vacuumer reclaims the message table's dead rows on PostgreSQL. Every message the
// relay completes leaves a dead row behind its DELETE; autovacuum visits a database
// once a minute by default, so a busy queue would grow by a minute of traffic (and
// its fetches would step over as many dead index entries) before the space is
// reused. Once the store has deleted Config.VacuumAfter rows since its last run, one
// background VACUUM of the table runs: on a queue of few live rows it reads little
// and ends in milliseconds.
//
// A VACUUM reads every page that is not all-visible, so on a large table (a backlog
// being drained) it costs in proportion to the table, not to the deletions: after a
// VACUUM that took d, the next waits at least 9·d, which keeps VACUUM to at most a
// tenth of one connection's time whatever the table's size.
//
// SKIP_LOCKED: a VACUUM already running (a peer relay's, autovacuum's) makes this
// one a no-op rather than a wait. TRUNCATE false: giving the table's tail back to
// the file system takes an exclusive lock that would stall the writers; the space
// stays allocated and is reused.
type vacuumer struct {
	mu      sync.Mutex
	deleted int
	running bool
	stopped bool
	rest    time.Time // no VACUUM starts before
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
	warned  bool
}

// count notes n deleted rows and starts a VACUUM when they reach the threshold.
func (v *vacuumer) count(s *Store, n int) {
	if s.dialect != PostgreSQL || s.cfg.VacuumAfter < 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.deleted += n
	if v.running || v.stopped || v.deleted < s.cfg.VacuumAfter || time.Now().Before(v.rest) {
		return
	}
	if v.ctx == nil {
		v.ctx, v.cancel = context.WithCancel(context.Background())
	}
	v.deleted, v.running = 0, true
	v.wg.Add(1)
	go v.run(s)
}

func (v *vacuumer) run(s *Store) {
	defer v.wg.Done()
	ctx, cancel := context.WithTimeout(v.ctx, time.Minute)
	defer cancel()
	start := time.Now()
	_, err := s.db.exec(ctx, "VACUUM (SKIP_LOCKED, TRUNCATE false) "+s.cfg.Table)
	took := time.Since(start)
	v.mu.Lock()
	defer v.mu.Unlock()
	v.running = false
	v.rest = time.Now().Add(9 * took)
	if err != nil && v.ctx.Err() == nil && !v.warned {
		v.warned = true
		s.cfg.Logger.Warn("sqlstore: VACUUM of the message table failed; autovacuum alone reclaims its dead rows (set Config.VacuumAfter to -1 to stop trying)", "table", s.cfg.Table, "error", err)
	}
}

// stop cancels a running VACUUM and waits for it.
func (v *vacuumer) stop() {
	v.mu.Lock()
	v.stopped = true
	cancel := v.cancel
	v.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	v.wg.Wait()
}
