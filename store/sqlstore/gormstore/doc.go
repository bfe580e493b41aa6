// Package gormstore is the SQL outbox store on a *gorm.DB: PostgreSQL, MySQL/MariaDB
// and SQLite, through the gorm dialector the application opened. It is package
// sqlstore's [sqlstore.Store] with gorm beginning the transactions of its units of
// work; the package exists so that an application on pgx or database/sql does not
// compile gorm.
//
// [New] builds the store; the dialect follows the dialector's name (postgres, mysql
// or sqlite). Inside [sqlstore.Store.Transact], [Tx] returns the unit's transaction
// as a *gorm.DB bound to the unit's ctx, and every send made with that ctx joins the
// transaction; when the function returns nil, the staged messages are written with
// one multi-row INSERT and committed with the application's rows:
//
//	err := store.Transact(ctx, func(ctx context.Context) error {
//		tx, _ := gormstore.Tx(ctx)
//		if err := tx.Create(&order).Error; err != nil {
//			return err
//		}
//		return sender.Send(ctx, msg) // written in tx, or not at all
//	})
//
// A Transact inside another on the same store is a savepoint of gorm's transaction:
// when its function fails, its rows and its sends are undone and the outer function
// goes on.
//
// For a gorm transaction the application manages itself, it sends on an
// [outbox.NewScope] ctx and [EnqueueTx] writes what the scope holds (and any
// messages passed to it) into the transaction; after the commit,
// [sqlstore.Store.NotifyCommitted] with what it returned wakes the dispatchers.
// Relays and tools take the store itself; its relay side is
// [sqlstore.Store.Driver].
//
// # Semantics
//
//   - Everything outside a unit of work — the relay side, Enqueue, Migrate, LISTEN —
//     runs on gorm's *sql.DB (db.DB()), exactly as on a store built with
//     [sqlstore.NewDB]; package sqlstore documents it.
//   - A unit of work begins with db.WithContext(ctx).Begin, with the options of
//     [sqlstore.WithTxOptions] if any, so gorm's connection pool, its PrepareStmt mode
//     and its DefaultTransactionTimeout apply. The outbox writes its messages in the
//     *sql.Tx under gorm's transaction and commits or rolls back that *sql.Tx, which
//     is what gorm's Commit and Rollback do.
//   - [Tx] is bound to the unit's ctx (tx.Statement.Context), so a gorm hook that
//     sends with it joins the unit. [sqlstore.SQLTx] returns the same transaction as
//     a *sql.Tx.
//   - A nested Transact runs SAVEPOINT outbox_sp_N on the *sql.Tx under gorm's
//     transaction, and RELEASE SAVEPOINT or ROLLBACK TO SAVEPOINT when it ends, as
//     package sqlstore does on database/sql; gorm's own SavePoint and RollbackTo, by
//     other names, work beside it.
//   - [sqlstore.Store.As] with a **gorm.DB returns the *gorm.DB given to [New].
//
// # Limitations
//
//   - The function given to Transact must not commit or roll back the *gorm.DB that
//     [Tx] returns (a *gorm.DB cannot refuse): Transact then fails when it writes the
//     messages, after the application's rows were committed. SavePoint and RollbackTo
//     work as usual.
//   - gorm's transaction must be a *sql.Tx underneath: gorm's default and its
//     PrepareStmt mode are; a custom ConnPool whose transactions are something else
//     makes Transact and [EnqueueTx] fail with [outbox.ErrMisconfigured].
//   - In PrepareStmt mode the outbox's INSERT is not prepared: its text changes with
//     the number of messages, so caching it would only fill gorm's statement cache.
//     The application's statements through [Tx] are prepared as usual.
//   - [sqlstore.WithTxOptions] is applied by the driver: SQLite's pure-Go driver
//     begins a read-only transaction as a plain deferred one, which does not refuse
//     writes.
package gormstore
