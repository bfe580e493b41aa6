package quickstart_test

import (
	"context"
	"errors"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// The README's quick start: PostgreSQL + Kafka, one unit of work. (Compiled, not run:
// TestQuickStart runs the same program against real servers.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	check(err)
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{})
	check(err)
	check(store.Migrate(ctx)) // creates the outbox tables; run it at deploy time

	client, err := kgo.NewClient(kgo.SeedBrokers(os.Getenv("KAFKA_BROKERS")))
	check(err)
	transport, err := kafkatransport.New(client, kafkatransport.Config{})
	check(err)

	// The relay publishes what commits, sharing the work with every other process
	// through leases. Run fails at once on a store that was never migrated, returns the
	// error that stops it, and hands its leases back when ctx ends.
	r, err := relay.New(store, transport, relay.Config{})
	check(err)
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(ctx) }()

	// The sender: a send joins the unit of work of the ctx it is made with.
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
	check(err)

	err = store.Transact(ctx, func(ctx context.Context) error {
		tx, ok := sqlstore.PgxTx(ctx) // the unit's transaction
		if !ok {
			return errors.New("not inside a pgx unit of work")
		}
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, "order-7"); err != nil {
			return err // rolls back: no order, no message
		}
		return sender.Send(ctx, outbox.Message{
			Topic:   "order-placed",
			Key:     []byte("order-7"),
			Payload: []byte(`{"id":"order-7"}`),
		})
	})
	check(err)
	check(<-relayDone) // until SIGTERM, or the error that stopped the relay
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
