package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// The log mode (Config.Mode LogMode): the fast path writes logical decoding messages,
// the relay reads them from a slot (logstream.go), and messages the broker keeps
// refusing go to the table through the relay side's Enqueue.

// logMode reports whether the store writes its fast path into the log.
func (s *Store) logMode() bool { return s.cfg.Mode == LogMode }

// LogPrefix is the prefix of the store's logical decoding messages in LogMode:
// "outbox:" and the messages table's name, so two outboxes on one database never read
// each other's messages. Empty in TableMode.
func (s *Store) LogPrefix() string {
	if !s.logMode() {
		return ""
	}
	return "outbox:" + s.cfg.Table
}

// logWrite is the one-time check before a store's first write in LogMode: a message
// emitted where no slot reads it would be lost, so the first write of a store looks
// for wal_level=logical and the slot, and fails until both are there.
type logWrite struct{ ok atomic.Bool }

// verifyLog runs on q before a write in LogMode.
func (s *Store) verifyLog(ctx context.Context, q querier) error {
	if s.logw.ok.Load() {
		return nil
	}
	if err := s.checkLog(ctx, q, true); err != nil {
		return err
	}
	s.logw.ok.Store(true)
	return nil
}

// walLevelFix says how to turn logical decoding on, self-managed and on the managed
// services.
const walLevelFix = "set wal_level = logical (postgresql.conf or ALTER SYSTEM) and restart the server; on Amazon RDS and Aurora set rds.logical_replication = 1 in the DB parameter group, on Google Cloud SQL the flag cloudsql.logical_decoding = on, on Azure Database for PostgreSQL the server parameter wal_level = LOGICAL, then restart"

// checkLog checks the server runs the log mode: PostgreSQL 14 or later, wal_level
// logical and, if slot, the store's slot (pgoutput, this database) and publication.
func (s *Store) checkLog(ctx context.Context, q querier, slot bool) error {
	rs, err := q.query(ctx, "SELECT current_setting('server_version_num')::int, current_setting('wal_level'),"+
		" EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND plugin = 'pgoutput' AND database = current_database()),"+
		" EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $2)", s.cfg.Slot, s.cfg.Publication)
	if err != nil {
		return s.wrap(ctx, "check the log mode", err)
	}
	var version int64
	var level string
	var hasSlot, hasPub bool
	found := rs.Next()
	if found {
		err = rs.Scan(&version, &level, &hasSlot, &hasPub)
	}
	rs.Close()
	if err == nil {
		err = rs.Err()
	}
	if err != nil {
		return s.wrap(ctx, "check the log mode", err)
	}
	switch {
	case version < 140000:
		return fmt.Errorf("%w: sqlstore: Config.Mode LogMode needs PostgreSQL 14 or later (logical decoding messages through pgoutput); the server is version %d", outbox.ErrMisconfigured, version)
	case level != "logical":
		return fmt.Errorf("%w: sqlstore: Config.Mode LogMode needs the server setting wal_level = logical, and the server has wal_level = %s: %s", outbox.ErrMisconfigured, level, walLevelFix)
	case slot && (!hasSlot || !hasPub):
		return fmt.Errorf("%w: sqlstore: Config.Mode LogMode: the replication slot %q (pgoutput, this database) or the publication %q does not exist, and a message written with no slot to read it would be lost: run Store.Migrate first", outbox.ErrMisconfigured, s.cfg.Slot, s.cfg.Publication)
	}
	return nil
}

// emitStatement renders the statement that writes envs into the log: one
// pg_logical_emit_message per record, in order, in one statement.
func (s *Store) emitStatement(envs []*driver.Envelope) (string, []any) {
	records := encodeLogRecords(envs)
	args := make([]any, 0, 1+len(records))
	args = append(args, s.LogPrefix())
	if len(records) == 1 {
		return "SELECT pg_logical_emit_message(true, $1, $2::bytea)", append(args, records[0])
	}
	var b strings.Builder
	b.WriteString("SELECT pg_logical_emit_message(true, $1, r) FROM (VALUES ")
	for i, r := range records {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("($" + strconv.Itoa(i+2) + "::bytea)")
		args = append(args, r)
	}
	b.WriteString(") AS m(r)")
	return b.String(), args
}

// emit writes envs (already checked) into the log on q.
func (s *Store) emit(ctx context.Context, q querier, envs []*driver.Envelope) error {
	if len(envs) == 0 {
		return nil
	}
	if err := s.verifyLog(ctx, q); err != nil {
		return err
	}
	if err := s.verifyBuckets(ctx, q); err != nil {
		return err
	}
	query, args := s.emitStatement(envs)
	_, err := q.exec(ctx, query, args...)
	return err
}

// commitLogPgx pipelines the emit and the COMMIT, as commitPgx does the INSERT.
func (u *unit) commitLogPgx(ctx context.Context, envs []*driver.Envelope) error {
	s, tx := u.s, u.pgxTx
	defer u.pgxConn.Release()
	if len(envs) == 0 {
		return s.wrap(ctx, "commit", tx.Commit(ctx))
	}
	err := s.verifyLog(ctx, pgxQuerier{tx})
	if err == nil {
		err = s.verifyBuckets(ctx, pgxQuerier{tx})
	}
	if err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	query, args := s.emitStatement(envs)
	batch := &pgx.Batch{}
	batch.Queue(query, args...)
	batch.Queue("COMMIT")
	br := tx.SendBatch(ctx, batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return s.wrap(ctx, "write into the log in transaction", err)
	}
	tag, commitErr := br.Exec()
	if commitErr == nil && tag.String() == "ROLLBACK" {
		commitErr = pgx.ErrTxCommitRollback
	}
	closeErr := br.Close()
	if commitErr != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return s.wrap(ctx, "commit", commitErr)
	}
	return s.wrap(ctx, "commit", closeErr)
}

// commitLogSQL writes envs into the log on the database/sql transaction and commits.
func (u *unit) commitLogSQL(ctx context.Context, envs []*driver.Envelope) error {
	s := u.s
	if err := s.emit(ctx, sqlQuerier{u.sqlTx}, envs); err != nil {
		u.rollback(ctx)
		return s.wrap(ctx, "write into the log in transaction", endedInside(err, len(envs)))
	}
	return s.wrap(ctx, "commit", endedInside(u.sqlTx.Commit(), len(envs)))
}

// enqueueLog is Store.Enqueue in LogMode: one statement, its own transaction.
func (s *Store) enqueueLog(ctx context.Context, envs []*driver.Envelope) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := s.check(envs); err != nil {
		return err
	}
	return s.wrap(ctx, "write into the log", s.emit(ctx, s.db, envs))
}

// migrateLog creates the publication and the slot of the log mode, after the tables.
// The slot cannot be created in a transaction that wrote, so it is created on its own.
func (s *Store) migrateLog(ctx context.Context) error {
	if err := s.checkLog(ctx, s.db, false); err != nil {
		return err
	}
	rs, err := s.db.query(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1), EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $2)", s.cfg.Publication, s.cfg.Slot)
	if err != nil {
		return s.wrap(ctx, "migrate the log mode", err)
	}
	var hasPub, hasSlot bool
	if rs.Next() {
		err = rs.Scan(&hasPub, &hasSlot)
	}
	rs.Close()
	if err == nil {
		err = rs.Err()
	}
	if err != nil {
		return s.wrap(ctx, "migrate the log mode", err)
	}
	if !hasPub {
		// A publication of no table: the reader asks for messages alone.
		if _, err := s.db.exec(ctx, "CREATE PUBLICATION "+s.cfg.Publication); err != nil && !duplicateObject(err) {
			return s.wrap(ctx, "create the publication", err)
		}
	}
	if !hasSlot {
		if _, err := s.db.exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", s.cfg.Slot); err != nil && !duplicateObject(err) {
			return s.wrap(ctx, "create the replication slot", err)
		}
	}
	return nil
}

// duplicateObject reports SQLSTATE 42710: a concurrent Migrate created it first.
func duplicateObject(err error) bool {
	var state interface{ SQLState() string }
	return errors.As(err, &state) && state.SQLState() == "42710"
}

// DropLog drops the log mode's replication slot and publication, so the server no
// longer keeps write-ahead log for them: run it when a store leaves LogMode (or is
// removed), after its relays stopped; the slot of a running reader cannot be dropped
// (the error says which process holds it). Messages written into the log and not yet
// relayed are lost with the slot; messages in the table stay. Dropping what does not
// exist is no error. It runs in TableMode too, with the Slot and Publication of the
// config (defaults included), for a store switched back.
func (s *Store) DropLog(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	return s.dropLog(ctx)
}

func (s *Store) dropLog(ctx context.Context) error {
	if s.dialect != PostgreSQL {
		return fmt.Errorf("%w: sqlstore: DropLog on a %v store, which has no log mode", outbox.ErrMisconfigured, s.dialect)
	}
	cfg := s.cfg
	if cfg.Slot == "" || cfg.Publication == "" {
		c := cfg
		c.Mode = LogMode
		c.Slot, c.Publication = "", ""
		d, err := c.withDefaults()
		if err != nil {
			return err
		}
		cfg.Slot, cfg.Publication = d.Slot, d.Publication
	}
	if _, err := s.db.exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", cfg.Slot); err != nil {
		return s.wrap(ctx, "drop the replication slot", err)
	}
	if _, err := s.db.exec(ctx, "DROP PUBLICATION IF EXISTS "+cfg.Publication); err != nil {
		return s.wrap(ctx, "drop the publication", err)
	}
	s.logw.ok.Store(false)
	return nil
}
