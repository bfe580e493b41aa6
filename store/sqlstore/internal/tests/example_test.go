package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/glebarez/go-sqlite" // registers the pure-Go "sqlite" driver

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// The runnable counterparts of package sqlstore's examples, on SQLite: package
// sqlstore's own examples are compiled but not run, since its tests import no
// database driver.

// A unit of work on SQLite: the order row and its message commit together, and a
// relay publishes the message.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)

	// One writer at a time: immediate transactions, WAL and a busy timeout make
	// concurrent writers wait instead of failing with SQLITE_BUSY.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	defer db.Close()

	store, err := sqlstore.NewDB(db, sqlstore.SQLite, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	if err != nil {
		panic(err)
	}

	err = store.Transact(ctx, func(ctx context.Context) error {
		tx, _ := sqlstore.SQLTx(ctx) // the unit's *sql.Tx
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ('order-1')"); err != nil {
			return err
		}
		// Sent with fn's ctx: written in the same transaction.
		return sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")})
	})
	if err != nil {
		panic(err)
	}

	rec := outboxtest.NewRecorder()
	relay, err := relay.New(store, rec, relay.Config{})
	if err != nil {
		panic(err)
	}
	res, err := relay.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("published:", res.Published)
	for _, m := range rec.Messages() {
		fmt.Printf("%s %s %s\n", m.Topic, m.Key, m.Payload)
	}
	// Output:
	// published: 1
	// orders order-1 created
}

// exampleDB opens a SQLite database in dir with the orders table and a migrated
// store on it.
func exampleDB(dir string) (*sql.DB, *sqlstore.Store) {
	ctx := context.Background()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+
		"?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		panic(err)
	}
	store, err := sqlstore.NewDB(db, sqlstore.SQLite, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		panic(err)
	}
	return db, store
}

// pendingMessages counts the messages waiting in store.
func pendingMessages(ctx context.Context, store *sqlstore.Store) int {
	stats, err := store.Driver().(driver.Admin).Stats(ctx)
	if err != nil {
		panic(err)
	}
	n := 0
	for _, c := range stats.Pending {
		n += c
	}
	return n
}

// A unit of work whose function fails writes nothing: neither the order row nor the
// message, whatever the sender's mode.
func Example_transactFailureWritesNothing() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, store := exampleDB(dir)
	defer db.Close()
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate})

	errOutOfStock := errors.New("out of stock")
	err := store.Transact(ctx, func(ctx context.Context) error {
		tx, _ := sqlstore.SQLTx(ctx)
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ('order-1')"); err != nil {
			return err
		}
		if err := sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")}); err != nil {
			return err
		}
		return errOutOfStock
	})
	fmt.Println("Transact:", err)

	var orders int
	_ = db.QueryRowContext(ctx, "SELECT COUNT(*) FROM orders").Scan(&orders)
	fmt.Println("orders:", orders, "messages:", pendingMessages(ctx, store))

	// A send with a ctx outside any unit of work, in the default Transactional mode,
	// fails instead of escaping the transaction.
	strict, _ := outbox.NewSender(store, outbox.SenderConfig{})
	err = strict.Send(ctx, outbox.Message{Topic: "orders", Payload: []byte("lost?")})
	fmt.Println(errors.Is(err, outbox.ErrNoTransaction))
	// Output:
	// Transact: out of stock
	// orders: 0 messages: 0
	// true
}

// An application that runs its own transaction opens a scope, sends with its ctx,
// and writes what the scope holds into the transaction with EnqueueTx.
func Example_enqueueTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, store := exampleDB(dir)
	defer db.Close()
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ('order-1')"); err != nil {
		panic(err)
	}
	if err := sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")}); err != nil {
		panic(err)
	}
	written, err := store.EnqueueTx(ctx, tx) // takes the scope's messages
	if err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}
	store.NotifyCommitted(written...) // after the commit, never before
	fmt.Println("written:", len(written), "left on the scope:", scope.Len())
	// Output:
	// written: 1 left on the scope: 0
}
