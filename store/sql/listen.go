package sqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Subscribe implements [outbox.Notifier]. Commits made through this store wake
// subscribers directly; on PostgreSQL (unless Config.DisableNotify) the first
// subscription also starts a LISTEN on a dedicated connection, so commits made by
// other processes wake them too. The listener reconnects after its connection drops
// and then wakes every bucket, as notifications sent meanwhile were lost.
func (s *Store) Subscribe(ctx context.Context) <-chan int {
	ch := s.hub.Subscribe(ctx)
	if s.dialect == PostgreSQL && !s.cfg.DisableNotify && !s.closed.Load() {
		s.startListener()
	}
	return ch
}

func (s *Store) startListener() {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	if s.listenDone != nil || s.closed.Load() {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.listenCancel = cancel
	s.listenDone = make(chan struct{})
	go s.listen(ctx, s.listenDone)
}

func (s *Store) stopListener() {
	s.listenMu.Lock()
	cancel, done := s.listenCancel, s.listenDone
	s.listenMu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// listen keeps one LISTEN session alive until ctx ends.
func (s *Store) listen(ctx context.Context, done chan struct{}) {
	defer close(done)
	const maxBackoff = 5 * time.Second
	backoff := 50 * time.Millisecond
	for {
		err := s.withListenConn(ctx, func(conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, `LISTEN "`+s.cfg.NotifyChannel+`"`); err != nil {
				return err
			}
			backoff = 50 * time.Millisecond
			// Anything committed while no session listened went unannounced.
			s.wakeAll()
			for {
				n, err := conn.WaitForNotification(ctx)
				if err != nil {
					return err
				}
				s.hub.Notify(parseBuckets(n.Payload, s.cfg.BucketCount)...)
			}
		})
		if ctx.Err() != nil {
			return
		}
		s.cfg.Logger.Warn("sqlstore: LISTEN connection lost; reconnecting", "channel", s.cfg.NotifyChannel, "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

var errNotPgx = errors.New("sqlstore: LISTEN needs the pgx driver (github.com/jackc/pgx/v5/stdlib) behind *sql.DB; wake-ups from other processes are off")

// withListenConn runs fn on a connection taken out of the caller's pool for good:
// a connection that ran LISTEN must never serve other work.
func (s *Store) withListenConn(ctx context.Context, fn func(*pgx.Conn) error) error {
	if s.pool != nil {
		pc, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conn := pc.Hijack()
		defer conn.Close(context.WithoutCancel(ctx))
		return fn(conn)
	}
	c, err := s.sqlDB.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	var fnErr error
	_ = c.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			fnErr = errNotPgx
			return nil
		}
		fnErr = fn(pc.Conn())
		// Discard the connection rather than return it, still listening, to the pool.
		return driver.ErrBadConn
	})
	if errors.Is(fnErr, errNotPgx) {
		s.cfg.Logger.Warn(fnErr.Error())
		<-ctx.Done()
	}
	return fnErr
}

func (s *Store) wakeAll() {
	all := make([]int, s.cfg.BucketCount)
	for i := range all {
		all[i] = i
	}
	s.hub.Notify(all...)
}

// parseBuckets reads a notification payload: bucket numbers separated by commas.
func parseBuckets(payload string, count int) []int {
	var out []int
	for _, f := range strings.Split(payload, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(f))
		if err == nil && b >= 0 && b < count {
			out = append(out, b)
		}
	}
	return out
}
