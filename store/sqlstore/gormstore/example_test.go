package gormstore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/gormstore"
)

// Order is the application's gorm model in the examples.
type Order struct{ ID string }

// openExampleDB opens gorm on a SQLite file: immediate transactions, WAL and a busy
// timeout make writers wait for the lock instead of failing.
func openExampleDB(dir string) *gorm.DB {
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+
		"?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		panic(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		panic(err)
	}
	return db
}

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

// A unit of work on a gorm store: Tx is the unit's transaction, already bound to the
// unit's ctx, and the order row and its message commit together.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db := openExampleDB(dir)

	store, err := gormstore.New(db, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	err = store.Transact(ctx, func(ctx context.Context) error {
		tx, _ := gormstore.Tx(ctx)
		if err := tx.Create(&Order{ID: "order-1"}).Error; err != nil {
			return err
		}
		return sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")})
	})
	if err != nil {
		panic(err)
	}
	var orders int64
	db.Model(&Order{}).Count(&orders)
	fmt.Println("orders:", orders, "messages:", pendingMessages(ctx, store))
	// Output:
	// orders: 1 messages: 1
}

// A gorm transaction the application runs itself: sends stage on a scope, and
// EnqueueTx writes them in the transaction.
func ExampleEnqueueTx() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db := openExampleDB(dir)
	store, err := gormstore.New(db, sqlstore.Config{})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	sender, _ := outbox.NewSender(store, outbox.SenderConfig{})

	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release() // reports messages no transaction took
	var written []*driver.Envelope
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{ID: "order-1"}).Error; err != nil {
			return err
		}
		if err := sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("order-1"), Payload: []byte("created")}); err != nil {
			return err
		}
		written, err = gormstore.EnqueueTx(ctx, store, tx) // takes the scope's messages
		return err
	})
	if err != nil {
		panic(err)
	}
	store.NotifyCommitted(written...) // after the commit, never before
	fmt.Println("written:", len(written), "left on the scope:", scope.Len())
	// Output:
	// written: 1 left on the scope: 0
}
