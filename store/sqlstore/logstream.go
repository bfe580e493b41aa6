package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// The log mode's reader: a replication connection streams the slot with pgoutput
// (protocol 1, the store's publication, messages on) and the stream hands out the
// store's transactional messages (by prefix) in commit order. The slot's confirmed
// position moves only to what the relay confirmed, or, while everything handed out is
// confirmed, past transactions that hold none of the store's messages.

// logDriverStore is the relay side of a store in LogMode: the table-mode relay side,
// and the stream.
type logDriverStore struct{ driverStore }

var _ driver.Streamer = logDriverStore{}

// Stream timings. The server drops a replication connection that says nothing for
// wal_sender_timeout (60 s by default); a status update goes out well before.
const (
	streamIdleWait       = 500 * time.Millisecond // Next returns empty after this
	streamLinger         = 500 * time.Microsecond // the longest wait for more commits to join a batch
	streamLingerMin      = 50 * time.Microsecond  // the shortest, once such waits catch nothing
	streamStatusInterval = 10 * time.Second
	streamMaxBatch       = 1024
)

// OpenStream implements [driver.Streamer] in LogMode: it opens a replication
// connection and starts streaming the slot from its confirmed position. A slot being
// read by another connection fails it (the server allows one reader per slot).
func (s logDriverStore) OpenStream(ctx context.Context) (driver.Stream, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	if !s.logMode() {
		return nil, fmt.Errorf("%w: sqlstore: OpenStream on a store in %v mode; set Config.Mode to LogMode", outbox.ErrMisconfigured, s.cfg.Mode)
	}
	cfg, err := s.replicationConfig(ctx)
	if err != nil {
		return nil, err
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, s.wrap(ctx, "open the replication connection", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.LogicalReplication,
		PluginArgs: []string{
			"proto_version '1'",
			"publication_names '" + s.cfg.Publication + "'",
			"messages 'true'",
		},
	})
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		if missingSchema(err) || isState(err, "42704") {
			return nil, fmt.Errorf("%w: sqlstore: the replication slot %q or the publication %q does not exist: run Store.Migrate: %w", outbox.ErrMisconfigured, s.cfg.Slot, s.cfg.Publication, err)
		}
		return nil, s.wrap(ctx, "start replication", err)
	}
	return &logStream{s: s.Store, conn: conn, prefix: s.LogPrefix(), lastStatus: time.Now(), linger: streamLinger}, nil
}

func isState(err error, state string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == state
}

// replicationConfig is the replication connection's configuration: Config.ReplicationURL,
// or the client's own settings.
func (s *Store) replicationConfig(ctx context.Context) (*pgconn.Config, error) {
	var cfg *pgconn.Config
	switch {
	case s.cfg.ReplicationURL != "":
		c, err := pgconn.ParseConfig(s.cfg.ReplicationURL)
		if err != nil {
			return nil, fmt.Errorf("%w: sqlstore: Config.ReplicationURL: %w", outbox.ErrMisconfigured, err)
		}
		cfg = c
	case s.pool != nil:
		cfg = s.pool.Config().ConnConfig.Config.Copy()
	default:
		conn, err := s.sqlDB.Conn(ctx)
		if err != nil {
			return nil, s.wrap(ctx, "open the replication connection", err)
		}
		_ = conn.Raw(func(dc any) error {
			if p, ok := dc.(interface{ Conn() *pgx.Conn }); ok {
				cfg = p.Conn().Config().Config.Copy()
			}
			return nil
		})
		_ = conn.Close()
		if cfg == nil {
			return nil, fmt.Errorf("%w: sqlstore: LogMode on a *sql.DB whose driver is not pgx's stdlib: set Config.ReplicationURL to reach the server for replication", outbox.ErrMisconfigured)
		}
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["replication"] = "database"
	return cfg, nil
}

// logStream is one replication connection's stream of the store's messages.
type logStream struct {
	s      *Store
	conn   *pgconn.PgConn
	prefix string

	inTx   bool
	txEnvs []*driver.Envelope // the open transaction's messages
	ready  []*driver.Envelope // whole transactions not yet handed out
	txns   int                // how many transactions ready holds
	// linger is how long a batch waits for one more commit: see adapt.
	linger time.Duration
	// readyPos is past the last transaction in ready; handed past the last handed
	// out; confirmed what the caller confirmed; idle the latest position past which
	// every transaction was received (commits without our messages, keepalives).
	readyPos, handed, confirmed, idle pglogrepl.LSN
	reported                          pglogrepl.LSN // last position sent to the server
	lastStatus                        time.Time
	broken                            error
}

// Next implements [driver.Stream].
func (st *logStream) Next(ctx context.Context) ([]*driver.Envelope, driver.StreamPosition, error) {
	if st.broken != nil {
		return nil, 0, st.broken
	}
	idleUntil := time.Now().Add(streamIdleWait)
	for {
		if len(st.ready) >= streamMaxBatch {
			return st.hand()
		}
		if time.Since(st.lastStatus) >= streamStatusInterval {
			if err := st.status(false); err != nil {
				return nil, 0, st.fail(err)
			}
		}
		until := idleUntil
		if next := st.lastStatus.Add(streamStatusInterval); next.Before(until) {
			until = next
		}
		if len(st.ready) > 0 {
			// Commits already on their way join the batch.
			until = time.Now().Add(st.linger)
		}
		rctx, cancel := context.WithDeadline(ctx, until)
		msg, err := st.conn.ReceiveMessage(rctx)
		timedOut := rctx.Err() != nil && ctx.Err() == nil
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			if timedOut && pgconn.Timeout(err) {
				if len(st.ready) > 0 {
					st.adapt()
					return st.hand()
				}
				if !time.Now().Before(idleUntil) {
					return nil, 0, nil
				}
				continue
			}
			return nil, 0, st.fail(err)
		}
		if err := st.receive(msg); err != nil {
			return nil, 0, st.fail(err)
		}
	}
}

// hand hands out the ready transactions.
func (st *logStream) hand() ([]*driver.Envelope, driver.StreamPosition, error) {
	out := st.ready
	st.ready, st.txns = nil, 0
	st.handed = st.readyPos
	return out, driver.StreamPosition(st.handed), nil
}

// adapt sets the next batch's linger when this one is handed out after waiting in
// vain for another commit. Where commits come closer together than streamLinger, a
// batch gathers several and the full wait pays for itself in fewer, larger publishes;
// where they come apart, every message would wait it out for nothing, so each batch of
// one transaction halves the wait, down to streamLingerMin, and the first batch of
// several restores it.
func (st *logStream) adapt() {
	if st.txns > 1 {
		st.linger = streamLinger
		return
	}
	st.linger = max(st.linger/2, streamLingerMin)
}

func (st *logStream) fail(err error) error {
	if st.broken == nil {
		st.broken = fmt.Errorf("sqlstore: log stream: %w", err)
	}
	return st.broken
}

// receive takes one message of the replication connection.
func (st *logStream) receive(msg pgproto3.BackendMessage) error {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return nil
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return err
			}
			if !st.inTx && ka.ServerWALEnd > st.idle {
				st.idle = ka.ServerWALEnd
			}
			if ka.ReplyRequested {
				return st.status(false)
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return err
			}
			return st.decode(xld.WALData)
		}
		return nil
	case *pgproto3.ErrorResponse:
		return pgconn.ErrorResponseToPgError(msg)
	case *pgproto3.CopyDone:
		return fmt.Errorf("the server ended the stream")
	}
	return nil
}

// decode takes one pgoutput message.
func (st *logStream) decode(data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case 'B':
		st.inTx, st.txEnvs = true, nil
		return nil
	case 'C':
		m, err := pglogrepl.Parse(data)
		if err != nil {
			return err
		}
		c := m.(*pglogrepl.CommitMessage)
		st.inTx = false
		if len(st.txEnvs) > 0 {
			st.ready = append(st.ready, st.txEnvs...)
			st.txns++
			st.readyPos = c.TransactionEndLSN
			st.txEnvs = nil
		} else if c.TransactionEndLSN > st.idle {
			st.idle = c.TransactionEndLSN
		}
		return nil
	case 'M':
		m, err := pglogrepl.Parse(data)
		if err != nil {
			return err
		}
		ldm := m.(*pglogrepl.LogicalDecodingMessage)
		if !ldm.Transactional || ldm.Prefix != st.prefix || !st.inTx {
			return nil
		}
		// The content points into the connection's buffer: decode a copy.
		envs, err := decodeLogRecord(append([]byte(nil), ldm.Content...))
		if err != nil {
			return fmt.Errorf("the message at %s: %w", ldm.LSN, err)
		}
		st.txEnvs = append(st.txEnvs, envs...)
	}
	return nil
}

// safe is the position the server may forget the slot up to.
func (st *logStream) safe() pglogrepl.LSN {
	if st.handed > st.confirmed || len(st.ready) > 0 {
		return st.confirmed
	}
	return max(st.confirmed, st.idle)
}

// status sends a standby status update with the safe position.
func (st *logStream) status(reply bool) error {
	pos := st.safe()
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), st.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ReplyRequested: reply,
	})
	if err != nil {
		return err
	}
	st.reported, st.lastStatus = pos, time.Now()
	return nil
}

// Confirm implements [driver.Stream]: it records pos and tells the server at once.
func (st *logStream) Confirm(ctx context.Context, pos driver.StreamPosition) error {
	if st.broken != nil {
		return st.broken
	}
	if p := pglogrepl.LSN(pos); p > st.confirmed {
		st.confirmed = p
	}
	if st.safe() == st.reported {
		return nil
	}
	if err := st.status(false); err != nil {
		return st.fail(err)
	}
	return nil
}

// Close implements [driver.Stream]: a last status update, then it ends the
// replication (CopyDone, answered by the server once the slot is released, so the
// next reader can start at once) and closes the connection. ctx bounds the wait.
func (st *logStream) Close(ctx context.Context) error {
	if st.broken == nil {
		if st.safe() != st.reported {
			_ = st.status(false)
		}
		st.endCopy(ctx)
		st.broken = fmt.Errorf("%w: sqlstore: the log stream is closed", outbox.ErrClosed)
	}
	return st.conn.Close(ctx)
}

// endCopy leaves the copy mode and waits for the server to finish the replication
// command, for at most a few seconds.
func (st *logStream) endCopy(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st.conn.Frontend().Send(&pgproto3.CopyDone{})
	if err := st.conn.Frontend().Flush(); err != nil {
		return
	}
	for {
		msg, err := st.conn.ReceiveMessage(ctx)
		if err != nil {
			return
		}
		switch msg.(type) {
		case *pgproto3.ReadyForQuery, *pgproto3.ErrorResponse:
			return
		}
	}
}

// streamLag reads the slot's lag for Stats; nil when the slot does not exist.
func (s *Store) streamLag(ctx context.Context) (*driver.StreamLag, error) {
	slot := s.cfg.Slot
	if slot == "" {
		c := s.cfg
		c.Mode = LogMode
		d, err := c.withDefaults()
		if err != nil {
			return nil, err
		}
		slot = d.Slot
	}
	rs, err := s.db.query(ctx, "SELECT COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn), 0)::bigint, s.active,"+
		" COALESCE((SELECT EXTRACT(EPOCH FROM r.flush_lag) * 1000000 FROM pg_stat_replication r WHERE r.pid = s.active_pid), 0)::bigint"+
		" FROM pg_replication_slots s WHERE s.slot_name = $1", slot)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	if !rs.Next() {
		return nil, rs.Err()
	}
	lag := &driver.StreamLag{}
	var age int64
	if err := rs.Scan(&lag.Bytes, &lag.Active, &age); err != nil {
		return nil, err
	}
	lag.Age = time.Duration(age) * time.Microsecond
	return lag, rs.Err()
}
