package sqlstore

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Subscribe implements [driver.Notifier]. Commits made through this store wake
// subscribers directly; on PostgreSQL (unless Config.DisableNotify) the first
// subscription also starts a LISTEN on a dedicated connection, so commits made by
// other processes wake them too. The listener reconnects after its connection drops
// and then wakes every bucket, as notifications sent meanwhile were lost.
func (s driverStore) Subscribe(ctx context.Context) <-chan int {
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
				origin, list, _ := strings.Cut(n.Payload, ":")
				if origin == s.origin {
					continue // this store woke its own subscribers at commit
				}
				s.hub.Notify(parseBuckets(list, s.cfg.BucketCount)...)
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
	var fnErr error
	_ = c.Raw(func(dc any) error {
		pc, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			fnErr = errNotPgx
			return nil
		}
		fnErr = fn(pc.Conn())
		// Discard the connection rather than return it, still listening, to the pool.
		return sqldriver.ErrBadConn
	})
	_ = c.Close()
	if errors.Is(fnErr, errNotPgx) {
		// Another driver: give the connection back and wait idle; polling still works.
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

// notifySender sends NOTIFY for commits after they happen, from one goroutine that
// coalesces the buckets of every commit made while it was busy or within
// notifyGap of its last send.
//
// The notification is deliberately not part of the writer's transaction: PostgreSQL
// serialises the commits of transactions that NOTIFY (they queue on one lock held
// across the WAL flush), which would make concurrent writers commit one by one.
// Sent after the commit, it costs writers nothing; a process that dies between
// commit and send loses only the wake-up, and polling still finds the messages.
//
// A NOTIFY is a transaction with a commit record of its own, which PostgreSQL would
// flush to disk like any other: one more fsync per wake-up, shared by every writer.
// A wake-up needs no durability, so the sender commits it asynchronously
// (synchronous_commit off, for that transaction only): the listeners hear it at
// once and nobody waits for the disk.
type notifySender struct {
	mu      sync.Mutex
	pending map[int]struct{}
	signal  chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	stopped bool
}

func (n *notifySender) queue(s *Store, buckets []int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	if n.pending == nil {
		n.pending = make(map[int]struct{})
	}
	for _, b := range buckets {
		n.pending[b] = struct{}{}
	}
	if n.done == nil {
		ctx, cancel := context.WithCancel(context.Background())
		n.cancel, n.done, n.signal = cancel, make(chan struct{}), make(chan struct{}, 1)
		go n.run(ctx, s)
	}
	select {
	case n.signal <- struct{}{}:
	default:
	}
}

// take empties the pending set into a payload ("origin:3,5"), or "" when empty.
func (n *notifySender) take(origin string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.pending) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(origin)
	b.WriteByte(':')
	first := true
	for bucket := range n.pending {
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(strconv.Itoa(bucket))
	}
	clear(n.pending)
	return b.String()
}

// notifyGap is the least time between two NOTIFY statements of a store. Under load
// it makes one statement announce the commits of many transactions, at a cost of
// at most notifyGap to the first of them; a commit after a quiet spell is
// announced at once.
const notifyGap = time.Millisecond

func (n *notifySender) run(ctx context.Context, s *Store) {
	defer close(n.done)
	send := func(ctx context.Context) {
		payload := n.take(s.origin)
		if payload == "" {
			return
		}
		sendCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		// One simple-protocol query (no arguments) so that SET LOCAL applies to the
		// NOTIFY's transaction; channel and payload are identifier, hex and digits.
		query := "SET LOCAL synchronous_commit TO OFF; NOTIFY \"" + s.cfg.NotifyChannel + "\", '" + payload + "'"
		if _, err := s.db.exec(sendCtx, query); err != nil {
			s.cfg.Logger.Debug("sqlstore: NOTIFY failed; other processes find the messages on their next poll", "error", err)
		}
	}
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			// Announce what is still pending before the store closes.
			send(context.WithoutCancel(ctx))
			return
		case <-n.signal:
			if wait := notifyGap - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					continue
				case <-time.After(wait):
				}
			}
			last = time.Now()
			send(ctx)
		}
	}
}

func (n *notifySender) stop() {
	n.mu.Lock()
	n.stopped = true
	cancel, done := n.cancel, n.done
	n.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
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
