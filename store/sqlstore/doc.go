// Package sqlstore is the outbox store for SQL databases: PostgreSQL, MySQL/MariaDB
// and SQLite, on a client the application built — a *pgxpool.Pool ([NewPgx]) or a
// *sql.DB with its [Dialect] ([NewDB]). It never opens a connection and imports no
// database driver and no ORM. The store on a *gorm.DB is package gormstore
// (github.com/outboxkit/outbox/store/sqlstore/gormstore), built on [NewORM], the
// extension point for an ORM that begins its own transactions.
//
// A [Store] keeps messages in one table and coordination in two more (leases and
// relay heartbeats), named by [Config] and created by [Store.Migrate] (or by the DDL
// in docs/stores/sql.md, also returned by [Store.DDL]). The Store is what
// applications hold: it implements [outbox.Store] (units of work and Enqueue of
// messages) and [driver.SizeLimiter], and writes into the application's own
// transactions. Its relay side — the queue, the leases, [driver.Admin],
// [driver.Notifier], [driver.Finder], [driver.Retainer] and the inbox's keys — is
// behind [Store.Driver], which relays, the inbox and tools call; applications hand
// them the Store and never call it.
//
// The unit of work is [Store.Transact], the same on every client. Inside its
// function, the application reaches the transaction from the function's ctx through
// a typed accessor — [PgxTx] (a store built with [NewPgx]), [SQLTx] ([NewDB] and
// [NewORM]) or an ORM package's own (gormstore.Tx) — and every send made with that
// ctx joins the transaction; when the function returns nil, the staged messages
// are written with one multi-row INSERT and committed with the application's rows:
//
//	err := store.Transact(ctx, func(ctx context.Context) error {
//		tx, _ := sqlstore.PgxTx(ctx)
//		if _, err := tx.Exec(ctx, "UPDATE accounts SET ...", ...); err != nil {
//			return err
//		}
//		return sender.Send(ctx, msg) // written in tx, or not at all
//	})
//
// A Transact inside another on the same store is a savepoint of the open
// transaction (SAVEPOINT outbox_sp_N): when its function fails or panics, ROLLBACK
// TO SAVEPOINT undoes its statements and drops its sends, and the outer function
// goes on; when it succeeds, RELEASE SAVEPOINT keeps both for the outer unit's
// commit. [WithTxOptions] sets the isolation level or read-only mode of the next
// unit's transaction.
//
// For a transaction the application manages itself, it sends on an
// [outbox.NewScope] ctx and [Store.EnqueuePgxTx] or [Store.EnqueueTx] (gorm:
// gormstore.EnqueueTx) write what the scope holds, and any messages passed to them,
// into it; after the commit, [Store.NotifyCommitted] with what they returned wakes
// the dispatchers.
//
// # Log mode
//
// On PostgreSQL 14 or later with wal_level=logical, Config.Mode [LogMode] writes the
// fast path into the write-ahead log instead of the table: units of work,
// [Store.EnqueuePgxTx], [Store.EnqueueTx] and [Store.Enqueue] write each message with
// pg_logical_emit_message in the transaction (pipelined with the COMMIT on pgx), in a
// versioned encoding ([DecodeLogMessage]) under the prefix [Store.LogPrefix], and write
// no row. [Store.Migrate] creates a publication and a logical replication slot
// (pgoutput); the relay side then implements [driver.Streamer], which a relay reads
// with pglogrepl in commit order, confirming the slot only past what it settled.
// Messages the broker keeps refusing go to the table (the relay side's Enqueue), where
// relays drain them as in TableMode. Migrate, Check and the first write refuse a server
// without wal_level=logical, or without the slot, with [outbox.ErrMisconfigured].
// [Store.DropLog] drops the slot and the publication. An ID the store holds is not
// refused in LogMode (the log has no unique index). See docs/stores/postgres-log.md.
//
// # Semantics
//
//   - Seq comes from an identity (PostgreSQL), AUTO_INCREMENT (MySQL) or
//     AUTOINCREMENT (SQLite) column. An index on (status, bucket, seq) makes a
//     bucket's pending head one index range scan. Completed rows are deleted, so the
//     head is simply the lowest pending Seq: a transaction that took an earlier Seq
//     but committed after later ones is still fetched — nothing is skipped.
//   - Fetch always scans from the bucket's beginning, never from where it left off:
//     a cursor would skip that late commit, and a later message of its key could
//     overtake it. (PostgreSQL marks the index entries of deleted rows dead as scans
//     pass them, so a draining backlog stays cheap to scan until vacuum.)
//   - Complete deletes a batch with one statement; with retention, MarkDispatched
//     updates a batch with one statement and DeleteDispatched deletes at most its
//     limit per statement, so cleanup never holds locks for long.
//   - Lease and heartbeat writes are conditional UPDATEs (and an INSERT that does
//     nothing on conflict for a row not created yet); the affected-row count decides
//     the winner. ReadCoordination is one statement, hence one snapshot.
//     ReadRelays is one SELECT of the relay table alone (a row per relay, with its
//     heartbeat, stop stamp and bucket count).
//   - Every time is stored as integer microseconds since the Unix epoch (UTC), so
//     lease expiries round-trip exactly on every dialect.
//   - Wake-ups: commits through a store wake its subscribers in-process at once. On
//     PostgreSQL the store also sends NOTIFY after the commit (one background sender
//     coalesces concurrent commits), and the relay side's Subscribe LISTENs on a
//     dedicated connection that is reconnected with backoff if it drops; after a
//     reconnect every bucket is woken, as notifications sent meanwhile were lost.
//   - A message ID is stored once: writing it again (a message whose ID was set to
//     one stored already) fails with [outbox.ErrInvalidMessage], and the whole write
//     with it.
//   - Every write path (Enqueue, Transact's commit, the EnqueueTx methods, the relay
//     side's Enqueue) checks every message before it runs any statement of its own:
//     [outbox.Message.Validate] (so a NUL byte or invalid UTF-8 in a topic or header
//     key is [outbox.ErrInvalidMessage]), its bucket count
//     ([outbox.ErrMisconfigured]) and [Config.MaxMessageSize] ([outbox.ErrTooLarge]).
//     A refused call writes nothing.
//   - A table or column that does not exist (the store used before [Store.Migrate],
//     or on a schema an upgrade has not migrated yet) is an error wrapping
//     [outbox.ErrMisconfigured] that says to run Migrate, from every call that
//     touches the tables. The relay side's Check, which a relay calls at Start,
//     probes the three tables the relay uses (one SELECT each, reading no row) and
//     names the one that is missing or behind.
//   - Savepoints: a nested Transact costs one SAVEPOINT round trip and one RELEASE
//     (or ROLLBACK TO) round trip. Each unit numbers its own (outbox_sp_1,
//     outbox_sp_2, ...), apart from pgx's pseudo-nested transactions (sp_N) and
//     gorm's SavePoint names. PostgreSQL, MySQL/MariaDB (InnoDB) and SQLite all take
//     them.
//   - On pgx, a unit's INSERT and its COMMIT travel in one pipelined round trip.
//
// # Limitations
//
//   - SQLite has a single writer. Open it with _txlock=immediate,
//     _pragma=busy_timeout(N) and _pragma=journal_mode(WAL): writers then queue for
//     the lock instead of failing with SQLITE_BUSY, but a writer that waits longer
//     than the busy timeout still fails. The relay's writes queue behind the
//     application's.
//   - NOTIFY is sent after the commit, not inside it: a process that dies in between
//     loses the wake-up (other relays find the messages on their next poll). A
//     transaction written with an EnqueueTx method wakes nobody until
//     [Store.NotifyCommitted] is called.
//   - The function given to Transact must not commit or roll back the transaction
//     itself. The pgx.Tx that [PgxTx] returns refuses to; a *sql.Tx (or an ORM's
//     transaction object) cannot refuse, and Transact then fails when it writes the
//     messages: the application's rows are committed, its messages are not.
//   - [WithTxOptions] is applied by the driver on database/sql: SQLite's
//     pure-Go driver begins a read-only transaction as a plain deferred one, which
//     does not refuse writes.
//   - LISTEN through *sql.DB needs pgx's stdlib driver; another PostgreSQL driver
//     gets in-process wake-ups only. The LISTEN connection is taken from the
//     caller's pool for the store's lifetime.
//   - MySQL reports changed rather than matched rows, so a renewal to the expiry
//     already stored reports false there (the dispatcher always renews forward).
//   - On MySQL the Seq reported on written envelopes assumes a multi-row INSERT takes
//     consecutive AUTO_INCREMENT values (auto_increment_increment = 1, the default).
//     Ordering does not depend on it.
//   - A batch larger than the dialect's bind-parameter limit (about 4,600 messages on
//     PostgreSQL and MySQL, 2,300 on SQLite) is written as several INSERTs in one
//     transaction. MySQL's max_allowed_packet must fit a batch.
//   - Lease expiry compares host clocks, as for every store.
package sqlstore
