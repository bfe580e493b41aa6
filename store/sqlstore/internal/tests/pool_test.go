package tests

import (
	"bytes"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/internal/hooks"
)

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A store on a *sql.DB that closes the connections a relay returns, for want of idle
// room, says so once, with the fix; a pool with room enough hears nothing.
func TestIdleChurnWarning(t *testing.T) {
	// Read the pool's counter at every fetch that comes a millisecond after the last.
	hooks.IdleWindow.Store(int64(time.Millisecond))
	t.Cleanup(func() { hooks.IdleWindow.Store(0) })
	for _, maxIdle := range []int{0, 8} { // 0: database/sql's default, 2
		t.Run(fmt.Sprintf("MaxIdleConns=%d", maxIdle), func(t *testing.T) {
			ctx := testContext(t)
			db := sqliteDB(t)
			if maxIdle > 0 {
				db.SetMaxIdleConns(maxIdle)
			}
			var logs lockedBuffer
			s, err := sqlstore.NewDB(db, sqlstore.SQLite, withTable(sqlstore.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
			s = migrated(t, s, err)

			// What a relay draining buckets in parallel does to the pool: several
			// connections in use at once, all returned together.
			churn := func() {
				for range 6 {
					conns := make([]*sql.Conn, 6)
					for i := range conns {
						conns[i], err = db.Conn(ctx)
						require.NoError(t, err)
					}
					for _, c := range conns {
						require.NoError(t, c.Close())
					}
				}
			}
			fetch := func() {
				// Past the millisecond since the last look, however busy the machine.
				time.Sleep(5 * time.Millisecond)
				_, err := drv(s).Fetch(ctx, 0, 10)
				require.NoError(t, err)
			}
			fetch() // the first look only notes the counter
			churn()
			fetch()
			churn()
			fetch() // warned already: not again within the hour

			warnings := strings.Count(logs.String(), "SetMaxIdleConns")
			if maxIdle == 0 {
				require.Equal(t, 1, warnings, "logs: %s", logs.String())
				require.Contains(t, logs.String(), "level=WARN")
			} else {
				require.Zero(t, warnings, "logs: %s", logs.String())
			}
		})
	}
}
