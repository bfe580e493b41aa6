package sqlstore_test

// These examples need a PostgreSQL server, so they are compiled but not run; their
// runnable versions, on SQLite, are in the module's internal tests package. The tests
// of package sqlstore need no module the package itself does not: an application's
// go mod tidy loads them too.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// A unit of work on PostgreSQL through pgx: the order row and its message commit
// together, and a relay publishes the message. (Needs a PostgreSQL server, so this
// example is compiled but not run.)
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	store, err := sqlstore.NewPgx(pool, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
	if err != nil {
		panic(err)
	}

	err = store.Transact(ctx, func(ctx context.Context) error {
		tx, _ := sqlstore.PgxTx(ctx) // the unit's pgx.Tx
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", "order-1"); err != nil {
			return err
		}
		// Sent with fn's ctx: written in the same transaction.
		return sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")})
	})
	if err != nil {
		panic(err)
	}

	// stdoutTransport stands in for the application's transport (package kafka, ...).
	relay, err := relay.New(store, stdoutTransport{}, relay.Config{})
	if err != nil {
		panic(err)
	}
	res, err := relay.RunOnce(ctx) // prints "orders order-1 created"
	if err != nil {
		panic(err)
	}
	fmt.Println("published:", res.Published) // "published: 1"
}

// stdoutTransport prints what it publishes.
type stdoutTransport struct{}

func (stdoutTransport) Publish(_ context.Context, batch []*driver.Envelope) error {
	for _, env := range batch {
		fmt.Printf("%s %s %s\n", env.Topic, env.Key, env.Payload)
	}
	return nil
}

// A unit of work whose function fails writes nothing: neither the order row nor the
// message, whatever the sender's mode. (Needs a PostgreSQL server, so this example
// is compiled but not run.)
func ExampleStore_Transact() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{Mode: outbox.Immediate})

	errOutOfStock := errors.New("out of stock")
	err = store.Transact(ctx, func(ctx context.Context) error {
		tx, _ := sqlstore.PgxTx(ctx)
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id) VALUES ($1)", "order-1"); err != nil {
			return err
		}
		if err := sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")}); err != nil {
			return err
		}
		return errOutOfStock // the order row and the message roll back
	})
	fmt.Println("Transact:", err) // "Transact: out of stock"

	// A send with a ctx outside any unit of work, in the default Transactional mode,
	// fails instead of escaping the transaction.
	strict, _ := outbox.NewSender(store, outbox.SenderConfig{})
	err = strict.Send(ctx, outbox.Message{Topic: "orders", Payload: []byte("lost?")})
	fmt.Println(errors.Is(err, outbox.ErrNoTransaction)) // "true"
}

// An application that runs its own transaction opens a scope, sends with its ctx,
// and writes what the scope holds into the transaction with EnqueueTx. (Needs a
// PostgreSQL server, so this example is compiled but not run.)
func ExampleStore_EnqueueTx() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@localhost:5432/app")
	if err != nil {
		panic(err)
	}
	defer db.Close()
	store, err := sqlstore.NewDB(db, sqlstore.PostgreSQL, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback() // a no-op after Commit
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ($1)", "order-1"); err != nil {
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
	// Prints "written: 1 left on the scope: 0".
	fmt.Println("written:", len(written), "left on the scope:", scope.Len())
}

// On a pgx store, PgxTx is the unit's transaction. (Needs a PostgreSQL server, so
// this example is compiled but not run.)
func ExamplePgxTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	err = store.Transact(ctx, func(ctx context.Context) error {
		tx, _ := sqlstore.PgxTx(ctx)
		if _, err := tx.Exec(ctx, "UPDATE accounts SET balance = balance - $1 WHERE id = $2", 100, "acct-1"); err != nil {
			return err
		}
		return sender.Send(ctx, outbox.Message{Topic: "payments", Key: []byte("acct-1"), Payload: []byte("debited 100")})
	})
	if err != nil {
		panic(err)
	}
}

// WithTxOptions sets the isolation level or read-only mode of the next unit of work.
// (Needs a PostgreSQL server, so this example is compiled but not run.)
func ExampleWithTxOptions() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@localhost:5432/app")
	if err != nil {
		panic(err)
	}
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	serializable := sqlstore.WithTxOptions(ctx, sql.TxOptions{Isolation: sql.LevelSerializable})
	err = store.Transact(serializable, func(ctx context.Context) error {
		tx, _ := sqlstore.PgxTx(ctx)
		var stock int
		if err := tx.QueryRow(ctx, "SELECT stock FROM items WHERE id = $1", "item-1").Scan(&stock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "UPDATE items SET stock = $1 WHERE id = $2", stock-1, "item-1"); err != nil {
			return err
		}
		return sender.Send(ctx, outbox.Message{Topic: "stock", Key: []byte("item-1"), Payload: []byte("reserved")})
	})
	// A serialization failure (SQLSTATE 40001) rolled everything back: retry the
	// whole unit, which sends again.
	if err != nil {
		panic(err)
	}
}
