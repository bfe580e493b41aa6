package sqlstore

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
)

var (
	_ inbox.Store   = driverStore{}
	_ inbox.Remover = driverStore{}
)

// Inbox names the inbox table in the migration templates: Table + "_inbox".
func (n tableNames) Inbox() string { return n.Table + "_inbox" }

// InboxTable is the table that holds the inbox keys of an [inbox.Inbox] on the
// store: Config.Table + "_inbox", created by [Store.Migrate] (migration version 3).
func (s *Store) InboxTable() string { return s.cfg.Table + "_inbox" }

// StageInboxKey records key in the unit of work on ctx, for an [inbox.Inbox]: one
// INSERT into [Store.InboxTable] in the unit's transaction, before the consumer's
// function runs. A key recorded already inserts nothing and the call returns an
// error wrapping [inbox.ErrDuplicate], so the function is skipped and the unit rolls
// back. A key that a concurrent transaction inserted and has not committed makes
// the INSERT wait for it (the primary key's lock): if that transaction commits, the
// key is a duplicate; if it rolls back, this one records it. Under REPEATABLE READ
// or SERIALIZABLE the database may refuse such a unit with a serialization error
// instead; the consumer's redelivery then finds the key.
//
// On every client (pgx, database/sql, gorm) the INSERT is one statement and one
// round trip of its own: the unit sends it before the function's statements, so
// it cannot travel with the pipelined commit.
func (s driverStore) StageInboxKey(ctx context.Context, key inbox.Key) (func(error) bool, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	if err := checkInboxKey(key); err != nil {
		return nil, err
	}
	u, ok := driver.TxFrom[*unit](ctx)
	if !ok || u.s != s.Store {
		return nil, fmt.Errorf("sqlstore: StageInboxKey: call it with the ctx that Store.Transact passes to its function: %w", outbox.ErrNoTransaction)
	}
	q := u.querier()
	stmt := insertIgnore(s.dialect, s.InboxTable(), "consumer, msg_key, expires_at", "?, ?, ?", "consumer, msg_key")
	if s.dialect == PostgreSQL {
		stmt = rebind(stmt)
	}
	n, err := q.exec(ctx, stmt, key.Consumer, key.ID, key.ExpiresAt.UnixMicro())
	if err != nil {
		return nil, s.wrapInbox(ctx, "record inbox key", err)
	}
	if n == 0 {
		return nil, fmt.Errorf("sqlstore: key %q of consumer %q: %w", key.ID, key.Consumer, inbox.ErrDuplicate)
	}
	return nil, nil
}

// RemoveInboxKeys deletes at most limit inbox keys, of every consumer, that expired
// before before, in one statement outside any unit of work.
func (s driverStore) RemoveInboxKeys(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, fmt.Errorf("%w: sqlstore: RemoveInboxKeys: limit %d must be positive", outbox.ErrMisconfigured, limit)
	}
	t := s.InboxTable()
	var stmt string
	switch s.dialect {
	case PostgreSQL:
		stmt = "DELETE FROM " + t + " WHERE (consumer, msg_key) IN (SELECT consumer, msg_key FROM " + t +
			" WHERE expires_at < $1 ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)"
	case MySQL:
		stmt = "DELETE FROM " + t + " WHERE expires_at < ? ORDER BY expires_at LIMIT ?"
	default:
		stmt = "DELETE FROM " + t + " WHERE rowid IN (SELECT rowid FROM " + t + " WHERE expires_at < ? ORDER BY expires_at LIMIT ?)"
	}
	n, err := s.db.exec(ctx, stmt, before.UnixMicro(), limit)
	if err != nil {
		return int(n), s.wrapInbox(ctx, "remove expired inbox keys", err)
	}
	return int(n), nil
}

// wrapInbox is wrap, naming the inbox table when it is missing.
func (s *Store) wrapInbox(ctx context.Context, op string, err error) error {
	if ctx.Err() == nil && missingSchema(err) {
		return fmt.Errorf("sqlstore: %s: %w: the inbox table %s does not exist: run Store.Migrate at start-up (migration version 3 creates it), or apply the statements of Store.DDL: %w",
			op, outbox.ErrMisconfigured, s.InboxTable(), err)
	}
	return s.wrap(ctx, op, err)
}

// checkInboxKey refuses a key the table cannot hold.
func checkInboxKey(key inbox.Key) error {
	switch {
	case key.Consumer == "" || len(key.Consumer) > inbox.MaxConsumerLength || !utf8.ValidString(key.Consumer):
		return fmt.Errorf("%w: sqlstore: inbox consumer %q: it must be valid UTF-8 of 1 to %d bytes", outbox.ErrMisconfigured, key.Consumer, inbox.MaxConsumerLength)
	case key.ID == "" || len(key.ID) > inbox.MaxKeyLength || !utf8.ValidString(key.ID):
		return fmt.Errorf("%w: sqlstore: inbox key %q: it must be valid UTF-8 of 1 to %d bytes (inbox.Inbox hashes longer keys)", outbox.ErrInvalidMessage, key.ID, inbox.MaxKeyLength)
	}
	return nil
}
