package sqlstore_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"

	_ "github.com/glebarez/go-sqlite" // registers the pure-Go "sqlite" driver

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/dispatcher"
	"github.com/outboxkit/outbox/outboxtest"
	sqlstore "github.com/outboxkit/outbox/store/sql"
)

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

	err = store.Transact(ctx, nil, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES ('order-1')"); err != nil {
			return err
		}
		// The capture middleware does this for a Transactional route.
		env, err := outbox.NewEnvelope(outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")}, store.BucketCount())
		if err != nil {
			return err
		}
		return outbox.ScopeFrom(ctx).Stage(env)
	})
	if err != nil {
		panic(err)
	}

	rec := outboxtest.NewRecorder()
	relay, err := dispatcher.New(store, rec, dispatcher.Config{BucketCount: store.BucketCount()})
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
