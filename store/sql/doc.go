// Package sqlstore is the outbox store for SQL databases: PostgreSQL, MySQL/MariaDB
// and SQLite, on a client the application built — a *pgxpool.Pool ([NewPgx]), a
// *sql.DB with its [Dialect] ([NewDB]) or a *gorm.DB ([NewGorm]). It never opens a
// connection and imports no database driver.
//
// A [Store] keeps messages in one table and coordination in two more (leases and
// relay heartbeats), named by [Config] and created by [Store.Migrate] (or by the DDL
// in docs/stores/sql.md, also returned by [Store.DDL]). It implements
// [outbox.DispatchStore] and every optional capability: [outbox.Admin],
// [outbox.Notifier], [outbox.Finder], [outbox.Retainer], [outbox.SizeLimiter].
//
// Units of work write the envelopes staged on the context's [outbox.Scope] inside
// the application's own transaction, all of them in one multi-row INSERT:
//
//	err := store.TransactPgx(ctx, func(ctx context.Context, tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "UPDATE accounts SET ...", ...); err != nil {
//			return err
//		}
//		return sender.Send(ctx, msg) // a Transactional route stages it
//	})
//
// [Store.Transact] does the same with a *sql.Tx and [Store.TransactGorm] is the
// outbox's db.Transaction. For a transaction the application manages itself,
// [Store.EnqueuePgxTx], [Store.EnqueueTx] and [Store.EnqueueGormTx] write the staged
// envelopes into it; call [Store.NotifyCommitted] after the commit.
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
//   - Every time is stored as integer microseconds since the Unix epoch (UTC), so
//     lease expiries round-trip exactly on every dialect.
//   - Wake-ups: commits through a store wake its subscribers in-process at once. On
//     PostgreSQL the store also sends NOTIFY after the commit (one background sender
//     coalesces concurrent commits), and [Store.Subscribe] LISTENs on a dedicated
//     connection that is reconnected with backoff if it drops; after a reconnect every
//     bucket is woken, as notifications sent meanwhile were lost.
//   - An envelope ID is stored once: writing it again fails with
//     [outbox.ErrInvalidMessage].
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
