package sqlstore

import (
	"database/sql"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/store/sqlstore/internal/hooks"
)

// idleWatch notices a *sql.DB that closes connections as soon as they are returned
// because too few may stay idle (sql.DB.SetMaxIdleConns; database/sql keeps 2 by
// default). A relay uses several connections at once — drains and lease writes each
// up to the dispatcher's MaxConcurrency, and NOTIFY — so with the default most of
// them are closed after every call and opened again for the next: a new server
// session and every statement prepared again each time, which made relays on
// database/sql about 3× slower than on pgx. The store does not change the caller's
// pool settings; it says how to.
type idleWatch struct {
	next atomic.Int64 // unix nanoseconds of the next look; 0 before the first

	mu     sync.Mutex
	closed int64     // DBStats.MaxIdleClosed at the previous look
	warned time.Time // the last warning
}

const (
	// idleWindow is how often the counter is read: often enough to warn early, rare
	// enough that a burst of the application's own traffic does not count.
	idleWindow = 30 * time.Second
	// idleChurn is how many closes in one window are too many: a relay whose pool
	// keeps too few idle connections closes several per drain pass.
	idleChurn = 20
	// idleRewarn spaces warnings, so a long-running relay repeats it rarely.
	idleRewarn = time.Hour
)

// look reads db's counter once per idleWindow and warns when too many connections
// were closed for want of idle room. It costs an atomic load on most calls.
func (w *idleWatch) look(s *Store, db *sql.DB) {
	now := time.Now()
	next := w.next.Load()
	window := idleWindow
	if d := hooks.IdleWindow.Load(); d > 0 { // set by tests only
		window = time.Duration(d)
	}
	if now.UnixNano() < next || !w.next.CompareAndSwap(next, now.Add(window).UnixNano()) {
		return
	}
	st := db.Stats()
	w.mu.Lock()
	churn := st.MaxIdleClosed - w.closed
	w.closed = st.MaxIdleClosed
	warn := next != 0 && churn >= idleChurn && (w.warned.IsZero() || now.Sub(w.warned) >= idleRewarn)
	if warn {
		w.warned = now
	}
	w.mu.Unlock()
	if warn {
		s.cfg.Logger.Warn("sqlstore: database/sql closed connections as soon as they were returned, because too few may stay idle; "+
			"each one is opened again for the next call (a new server session, every statement prepared again), which slows the relay several times: "+
			"call db.SetMaxIdleConns with at least 2 × the dispatcher's MaxConcurrency + 2 (10 with its defaults), or equal to SetMaxOpenConns; "+
			"on PostgreSQL, a *sql.DB from stdlib.OpenDBFromPool or a store built with NewPgx avoids it too",
			"closed", churn, "within", window, "max_open", st.MaxOpenConnections, "open", st.OpenConnections)
	}
}
