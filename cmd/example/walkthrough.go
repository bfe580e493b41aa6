package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// topic is where order events go.
const topic = "order-placed"

// relayID is the relay's stable name: a restarted relay under the same name resumes
// its leases at once instead of waiting for them to lapse.
const relayID = "orders-relay"

// errCrash stands for the process dying at that point.
var errCrash = errors.New("simulated crash")

// run tells the three stories on w and returns an error if one of them does not turn
// out as told. Each story gets fresh tables and a fresh view of the broker.
func run(ctx context.Context, w io.Writer, opts options) error {
	n := &narrator{w: w}
	stories := []struct {
		title string
		tell  func(context.Context, *narrator, *database, broker) error
	}{
		{"1. A naive dual write loses its message", naiveDualWrite},
		{"2. Immediate mode: the send survives the crash", immediateMode},
		{"3. Transactional mode: the order and its message commit together", transactionalMode},
	}
	for i, s := range stories {
		err := tellStory(ctx, opts, func(db *database, br broker) error {
			if i == 0 {
				n.say("outbox walkthrough: orders and the outbox in %s;\nmessages go to %s.\n", db.name, br.Name())
			}
			n.say("\n%s\n", s.title)
			if err := s.tell(ctx, n, db, br); err != nil {
				return fmt.Errorf("%s: %w", s.title, err)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if n.err != nil {
			return n.err
		}
	}
	return nil
}

// tellStory opens the database and the broker, runs tell, and cleans up after it.
func tellStory(ctx context.Context, opts options, tell func(*database, broker) error) error {
	db, err := openDatabase(ctx, opts)
	if err != nil {
		return err
	}
	cleanupCtx := context.WithoutCancel(ctx) // drop the tables even after Ctrl-C
	br, err := openBroker(ctx, opts)
	if err != nil {
		return errors.Join(err, db.close(cleanupCtx))
	}
	err = tell(db, br)
	return errors.Join(err, br.Close(), db.close(cleanupCtx))
}

// naiveDualWrite saves an order, then publishes straight to the broker, and crashes
// in between.
func naiveDualWrite(ctx context.Context, n *narrator, db *database, br broker) error {
	router := middleware.NewRouter()
	router.Handle(topic, middleware.Inline(br)) // no outbox: publish inline

	placeOrder := func(ctx context.Context, id string, crash func() error) error {
		if err := db.saveOrder(ctx, id); err != nil {
			return err
		}
		if err := crash(); err != nil {
			return err
		}
		return router.Send(ctx, orderPlaced(id))
	}

	n.say("   The handler saves order 1001, then publishes %s straight to the broker.\n", topic)
	n.say("   The process crashes between the two, and restarts.\n")
	err := placeOrder(ctx, "1001", func() error { return errCrash })
	if !errors.Is(err, errCrash) {
		return fmt.Errorf("expected the crash, got %v", err)
	}
	if err := db.restart(ctx); err != nil {
		return err
	}
	orders, err := db.savedOrders(ctx)
	if err != nil {
		return err
	}
	received, err := br.Received(ctx)
	if err != nil {
		return err
	}
	n.say("   Orders saved: %v. Messages the broker received: %d.\n", orders, len(received))
	if len(orders) != 1 || len(received) != 0 {
		return fmt.Errorf("expected 1 order and no message, got %d orders and %d messages", len(orders), len(received))
	}
	n.say("   => The order exists but nobody was told: the message is lost for good.\n")
	return nil
}

// immediateMode captures the send into the outbox before the crash, then shows the
// relay delivering it at least once across a relay crash.
func immediateMode(ctx context.Context, n *narrator, db *database, br broker) error {
	n.say("   The handler saves order 1002 and sends %s through the outbox's sender in\n", topic)
	n.say("   Immediate mode. The send is written to the outbox before Send returns; then\n")
	n.say("   the process crashes.\n")
	sender, err := outbox.NewSender(db.store, outbox.SenderConfig{Mode: outbox.Immediate, Transport: br})
	if err != nil {
		return err
	}
	router := middleware.NewRouter(middleware.CorrelationID())
	router.Handle(topic, sender)
	if err := db.saveOrder(ctx, "1002"); err != nil {
		return err
	}
	if err := router.Send(ctx, orderPlaced("1002")); err != nil {
		return err
	}

	n.say("   The process restarts and opens the database again.\n")
	if err := db.restart(ctx); err != nil {
		return err
	}
	orders, err := db.savedOrders(ctx)
	if err != nil {
		return err
	}
	waiting, err := pending(ctx, db.store)
	if err != nil {
		return err
	}
	n.say("   Orders saved: %v. Messages waiting in the outbox: %d.\n", orders, waiting)
	if waiting != 1 {
		return fmt.Errorf("expected 1 waiting message, got %d", waiting)
	}

	n.say("   Its relay publishes. The broker acknowledges, and the process crashes again\n")
	n.say("   before the relay can delete the message from the outbox. It restarts.\n")
	relay, err := newRelay(&crashAfterPublish{Store: db.store.Driver()}, br)
	if err != nil {
		return err
	}
	if _, err := relay.RunOnce(ctx); !errors.Is(err, errCrash) {
		return fmt.Errorf("expected the relay to crash, got %v", err)
	}
	if err := db.restart(ctx); err != nil {
		return err
	}
	received, err := br.Received(ctx)
	if err != nil {
		return err
	}
	if waiting, err = pending(ctx, db.store); err != nil {
		return err
	}
	n.say("   Messages the broker received: %d. Messages still in the outbox: %d.\n", len(received), waiting)
	if len(received) != 1 || waiting != 1 {
		return fmt.Errorf("expected 1 received and 1 waiting, got %d and %d", len(received), waiting)
	}

	n.say("   The restarted relay publishes the message again.\n")
	relay, err = newRelay(db.store, br)
	if err != nil {
		return err
	}
	if _, err := relay.RunOnce(ctx); err != nil {
		return err
	}
	if received, err = br.Received(ctx); err != nil {
		return err
	}
	if waiting, err = pending(ctx, db.store); err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, m := range received {
		ids[m.ID] = true
	}
	n.say("   Messages the broker received: %d, with %d distinct message id. Still in the outbox: %d.\n",
		len(received), len(ids), waiting)
	showDeliveries(n, received)
	if len(received) != 2 || len(ids) != 1 || waiting != 0 {
		return fmt.Errorf("expected 2 deliveries of 1 message and an empty outbox, got %d, %d, %d", len(received), len(ids), waiting)
	}

	n.say("   Both copies carry the same idempotency-key, so a consumer that deduplicates\n")
	n.say("   on it handles order 1002 once.\n")
	if processed := deduplicate(received); processed != 1 {
		return fmt.Errorf("expected the consumer to handle the order once, got %d", processed)
	}
	n.say("   => At least once: nothing lost, duplicates possible and recognisable.\n")
	n.say("   Immediate mode is not atomic with the order write, though: a crash between\n")
	n.say("   saving the order and Send would still leave an order without its message.\n")
	return nil
}

// transactionalMode commits the order and its send in one database transaction, then
// shows a rollback discarding both.
func transactionalMode(ctx context.Context, n *narrator, db *database, br broker) error {
	sender, err := outbox.NewSender(db.store, outbox.SenderConfig{Transport: br}) // Transactional: the default
	if err != nil {
		return err
	}
	router := middleware.NewRouter(middleware.CorrelationID())
	router.Handle(topic, sender)
	relay, err := newRelay(db.store, br)
	if err != nil {
		return err
	}

	// placeOrder is a request handler. The store's unit of work opens the transaction;
	// fn reaches it from its ctx, and every send made with that ctx is staged and
	// written in the same transaction as the order, just before the commit. A handler
	// error rolls back both.
	placeOrder := func(ctx context.Context, id string, fail error) error {
		return db.store.Transact(ctx, func(ctx context.Context) error {
			tx, _ := sqlstore.SQLTx(ctx)
			if _, err := tx.ExecContext(ctx, db.insertOrder(), id); err != nil {
				return err
			}
			if err := router.Send(ctx, orderPlaced(id)); err != nil {
				return err
			}
			return fail
		})
	}

	seen := 0 // deliveries already shown
	report := func(wantOrders, wantWaiting, wantPublished, wantReceived int) error {
		orders, err := db.savedOrders(ctx)
		if err != nil {
			return err
		}
		waiting, err := pending(ctx, db.store)
		if err != nil {
			return err
		}
		res, err := relay.RunOnce(ctx)
		if err != nil {
			return err
		}
		received, err := br.Received(ctx)
		if err != nil {
			return err
		}
		n.say("   Orders saved: %v. Messages in the outbox: %d. The relay publishes %d; the broker has received %d.\n",
			orders, waiting, res.Published, len(received))
		showDeliveries(n, received[seen:])
		seen = len(received)
		if len(orders) != wantOrders || waiting != wantWaiting || res.Published != wantPublished || len(received) != wantReceived {
			return fmt.Errorf("expected %d orders, %d waiting, %d published, %d received",
				wantOrders, wantWaiting, wantPublished, wantReceived)
		}
		return nil
	}

	n.say("   Order 1003: one transaction writes the order, and the send is staged and\n")
	n.say("   written with it.\n")
	if err := placeOrder(ctx, "1003", nil); err != nil {
		return err
	}
	if err := report(1, 1, 1, 1); err != nil {
		return err
	}

	declined := errors.New("payment declined")
	n.say("   Order 1004: the order is written and the send staged, then the handler fails\n")
	n.say("   (%v) and the transaction rolls back.\n", declined)
	if err := placeOrder(ctx, "1004", declined); !errors.Is(err, declined) {
		return fmt.Errorf("expected the unit of work to fail with %q, got %v", declined, err)
	}
	if err := report(1, 0, 0, 1); err != nil {
		return err
	}
	n.say("   A send made outside any unit of work is refused, not written on its own:\n")
	err = router.Send(ctx, orderPlaced("1005"))
	if !errors.Is(err, outbox.ErrNoTransaction) {
		return fmt.Errorf("expected outbox.ErrNoTransaction, got %v", err)
	}
	n.say("     %v\n", err)
	if err := report(1, 0, 0, 1); err != nil {
		return err
	}
	n.say("   => Both or neither: no order without its message, no message without its order.\n")
	return nil
}

// orderPlaced is the event for order id, keyed by the order so events of one order
// stay in order.
func orderPlaced(id string) outbox.Message {
	return outbox.Message{
		Topic:   topic,
		Key:     []byte("order-" + id),
		Payload: []byte(`{"order":"` + id + `","status":"placed"}`),
		Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}},
	}
}

// newRelay builds the relay the stories run one sweep at a time.
func newRelay(store driver.Handle, broker driver.Transport) (*relay.Relay, error) {
	return relay.New(store, broker, relay.Config{
		RelayID: relayID,
		Logger:  slog.New(slog.DiscardHandler), // the story is told on w
	})
}

// pending counts the messages waiting in the outbox, through the store's operator
// surface.
func pending(ctx context.Context, store driver.Handle) (int, error) {
	s, ok := store.Driver().(driver.Admin)
	if !ok {
		return 0, errors.New("the store does not implement driver.Admin")
	}
	total := 0
	after := driver.Cursor{}
	for {
		envs, err := s.List(ctx, driver.Pending, after, 100)
		if err != nil {
			return 0, err
		}
		total += len(envs)
		if len(envs) < 100 {
			return total, nil
		}
		after = driver.After(envs[len(envs)-1])
	}
}

// deduplicate is a consumer that handles each idempotency key once. It returns how
// many messages it handled.
func deduplicate(received []delivery) int {
	seen := map[string]bool{}
	for _, m := range received {
		if m.IdempotencyKey != "" {
			seen[m.IdempotencyKey] = true
		}
	}
	return len(seen)
}

// showDeliveries prints messages read back from the broker.
func showDeliveries(n *narrator, received []delivery) {
	for _, d := range received {
		n.say("     Read back: %v\n", d)
	}
}

// crashAfterPublish is the store as a relay process sees it that dies right after
// the broker acknowledged a batch: the Complete that would delete the batch never
// happens, and nothing the dead process tries afterwards reaches the store.
type crashAfterPublish struct {
	driver.Store
	dead atomic.Bool // buckets drain in parallel
}

// Driver hands the relay the wrapped store.
func (c *crashAfterPublish) Driver() driver.Store { return c }

func (c *crashAfterPublish) Complete(context.Context, []*driver.Envelope) error {
	c.dead.Store(true)
	return errCrash
}

func (c *crashAfterPublish) Release(ctx context.Context, held driver.Lease) (bool, error) {
	if c.dead.Load() {
		return false, errCrash
	}
	return c.Store.Release(ctx, held)
}

func (c *crashAfterPublish) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if c.dead.Load() {
		return errCrash
	}
	return c.Store.StopRelay(ctx, relay, at)
}

// narrator writes the story and keeps the first write error.
type narrator struct {
	w   io.Writer
	err error
}

func (n *narrator) say(format string, args ...any) {
	if n.err == nil {
		_, n.err = fmt.Fprintf(n.w, format, args...)
	}
}
