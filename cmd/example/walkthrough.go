package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/dispatcher"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/outboxtest"
)

// topic is where order events go.
const topic = "order-placed"

// relayID is the relay's stable name: a restarted relay under the same name resumes
// its leases at once instead of waiting for them to lapse.
const relayID = "orders-relay"

// errCrash stands for the process dying at that point.
var errCrash = errors.New("simulated crash")

// newBackend picks the backend each story runs on.
var newBackend = newMemoryBackend

// run tells the three stories on w and returns an error if one of them does not turn
// out as told.
func run(ctx context.Context, w io.Writer) error {
	n := &narrator{w: w}
	b, err := newBackend()
	if err != nil {
		return err
	}
	n.say("outbox walkthrough (%s)\n", b.Describe())
	if err := b.Close(); err != nil {
		return err
	}
	stories := []struct {
		title string
		tell  func(context.Context, *narrator, backend) error
	}{
		{"1. A naive dual write loses its message", naiveDualWrite},
		{"2. Immediate mode: the send survives the crash", immediateMode},
		{"3. Transactional mode: the order and its message commit together", transactionalMode},
	}
	for _, s := range stories {
		b, err := newBackend()
		if err != nil {
			return err
		}
		n.say("\n%s\n", s.title)
		err = s.tell(ctx, n, b)
		if cerr := b.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s.title, err)
		}
	}
	return n.err
}

// naiveDualWrite saves an order, then publishes straight to the broker, and crashes
// in between.
func naiveDualWrite(ctx context.Context, n *narrator, b backend) error {
	router := middleware.NewRouter()
	router.Handle(topic, middleware.Inline(b.Broker())) // no outbox: publish inline

	placeOrder := func(ctx context.Context, id string, crash func() error) error {
		if err := b.SaveOrder(ctx, id); err != nil {
			return err
		}
		if err := crash(); err != nil {
			return err
		}
		return router.Send(ctx, orderPlaced(id))
	}

	n.say("   The handler saves order 1001, then publishes %s straight to the broker.\n", topic)
	n.say("   The process crashes between the two.\n")
	err := placeOrder(ctx, "1001", func() error { return errCrash })
	if !errors.Is(err, errCrash) {
		return fmt.Errorf("expected the crash, got %v", err)
	}
	orders, err := b.Orders(ctx)
	if err != nil {
		return err
	}
	received := len(b.Broker().Received(topic))
	n.say("   Orders saved: %v. Messages the broker received: %d.\n", orders, received)
	if len(orders) != 1 || received != 0 {
		return fmt.Errorf("expected 1 order and no message, got %d orders and %d messages", len(orders), received)
	}
	n.say("   => The order exists but nobody was told: the message is lost for good.\n")
	return nil
}

// immediateMode captures the send into the outbox before the crash, then shows the
// relay delivering it at least once across a relay crash.
func immediateMode(ctx context.Context, n *narrator, b backend) error {
	ob, err := middleware.NewOutbox(b.Store(), middleware.Config{}) // Immediate is the default
	if err != nil {
		return err
	}
	router := middleware.NewRouter(middleware.CorrelationID())
	router.Handle(topic, nil, ob.UseOutbox())

	n.say("   The handler saves order 1002 and sends %s through a route with UseOutbox.\n", topic)
	n.say("   The send is written to the outbox before Send returns; then the process crashes.\n")
	if err := b.SaveOrder(ctx, "1002"); err != nil {
		return err
	}
	if err := router.Send(ctx, orderPlaced("1002")); err != nil {
		return err
	}
	orders, err := b.Orders(ctx)
	if err != nil {
		return err
	}
	waiting, err := pending(ctx, b.Store())
	if err != nil {
		return err
	}
	n.say("   Orders saved: %v. Messages waiting in the outbox: %d.\n", orders, waiting)
	if waiting != 1 {
		return fmt.Errorf("expected 1 waiting message, got %d", waiting)
	}

	n.say("   The process restarts and its relay publishes. The broker acknowledges,\n")
	n.say("   and the relay crashes before it can delete the message from the outbox.\n")
	crashing := &crashAfterPublish{store: b.Store()}
	relay, err := newRelay(crashing, b.Broker())
	if err != nil {
		return err
	}
	if _, err := relay.RunOnce(ctx); !errors.Is(err, errCrash) {
		return fmt.Errorf("expected the relay to crash, got %v", err)
	}
	received := b.Broker().Received(topic)
	if waiting, err = pending(ctx, b.Store()); err != nil {
		return err
	}
	n.say("   Messages the broker received: %d. Messages still in the outbox: %d.\n", len(received), waiting)
	if len(received) != 1 || waiting != 1 {
		return fmt.Errorf("expected 1 received and 1 waiting, got %d and %d", len(received), waiting)
	}

	n.say("   The relay restarts and publishes the message again.\n")
	relay, err = newRelay(b.Store(), b.Broker())
	if err != nil {
		return err
	}
	if _, err := relay.RunOnce(ctx); err != nil {
		return err
	}
	received = b.Broker().Received(topic)
	if waiting, err = pending(ctx, b.Store()); err != nil {
		return err
	}
	ids := map[string]bool{}
	for _, m := range received {
		ids[m.ID] = true
	}
	n.say("   Messages the broker received: %d, with %d distinct message id. Still in the outbox: %d.\n",
		len(received), len(ids), waiting)
	if len(received) != 2 || len(ids) != 1 || waiting != 0 {
		return fmt.Errorf("expected 2 deliveries of 1 message and an empty outbox, got %d, %d, %d", len(received), len(ids), waiting)
	}

	processed, key := deduplicate(received)
	n.say("   Both copies carry idempotency-key %s, so a consumer that\n", key)
	n.say("   deduplicates on it handles order 1002 once.\n")
	if processed != 1 {
		return fmt.Errorf("expected the consumer to handle the order once, got %d", processed)
	}
	n.say("   => At least once: nothing lost, duplicates possible and recognisable.\n")
	n.say("   Immediate mode is not atomic with the order write, though: a crash between\n")
	n.say("   SaveOrder and Send would still leave an order without its message.\n")
	return nil
}

// transactionalMode commits the order and its send in one unit of work, then shows a
// rollback discarding both.
func transactionalMode(ctx context.Context, n *narrator, b backend) error {
	ob, err := middleware.NewOutbox(b.Store(), middleware.Config{})
	if err != nil {
		return err
	}
	router := middleware.NewRouter(middleware.CorrelationID())
	router.Handle(topic, nil, ob.UseOutbox(middleware.WithMode(outbox.Transactional)))
	relay, err := newRelay(b.Store(), b.Broker())
	if err != nil {
		return err
	}

	// placeOrder is a request handler: a scope per request (middleware.ScopeHandler
	// does this for HTTP), the send staged on it, and one unit of work for both.
	placeOrder := func(ctx context.Context, id string, fail error) error {
		ctx, scope := outbox.NewScope(ctx)
		defer scope.Release()
		if err := router.Send(ctx, orderPlaced(id)); err != nil {
			return err
		}
		return b.CommitOrder(ctx, id, fail)
	}

	report := func(wantOrders, wantWaiting, wantPublished, wantReceived int) error {
		orders, err := b.Orders(ctx)
		if err != nil {
			return err
		}
		waiting, err := pending(ctx, b.Store())
		if err != nil {
			return err
		}
		res, err := relay.RunOnce(ctx)
		if err != nil {
			return err
		}
		received := len(b.Broker().Received(topic))
		n.say("   Orders saved: %v. Messages in the outbox: %d. The relay publishes %d; the broker has received %d.\n",
			orders, waiting, res.Published, received)
		if len(orders) != wantOrders || waiting != wantWaiting || res.Published != wantPublished || received != wantReceived {
			return fmt.Errorf("expected %d orders, %d waiting, %d published, %d received",
				wantOrders, wantWaiting, wantPublished, wantReceived)
		}
		return nil
	}

	n.say("   Order 1003: the send is staged on the request's scope, then one unit of work\n")
	n.say("   writes the order and the message together.\n")
	if err := placeOrder(ctx, "1003", nil); err != nil {
		return err
	}
	if err := report(1, 1, 1, 1); err != nil {
		return err
	}

	declined := errors.New("payment declined")
	n.say("   Order 1004: the send is staged, then the handler fails (%v)\n", declined)
	n.say("   and the unit of work rolls back.\n")
	if err := placeOrder(ctx, "1004", declined); !errors.Is(err, declined) {
		return fmt.Errorf("expected the unit of work to fail with %q, got %v", declined, err)
	}
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

// newRelay builds the dispatcher the stories run one sweep at a time.
func newRelay(store outbox.RelayStore, broker outbox.Transport) (*dispatcher.Dispatcher, error) {
	return dispatcher.New(store, broker, dispatcher.Config{
		RelayID:     relayID,
		BucketCount: store.BucketCount(),
		Logger:      slog.New(slog.DiscardHandler), // the story is told on w
	})
}

// pending counts the messages waiting in the outbox.
func pending(ctx context.Context, s outbox.Admin) (int, error) {
	total := 0
	after := outbox.Cursor{}
	for {
		envs, err := s.List(ctx, outbox.Pending, after, 100)
		if err != nil {
			return 0, err
		}
		total += len(envs)
		if len(envs) < 100 {
			return total, nil
		}
		after = outbox.After(envs[len(envs)-1])
	}
}

// deduplicate is a consumer that handles each idempotency key once. It returns how
// many messages it handled and the keys it saw.
func deduplicate(received []outboxtest.Received) (int, string) {
	seen := map[string]bool{}
	var keys []string
	for _, m := range received {
		key := ""
		for _, h := range m.Headers {
			if h.Key == outbox.HeaderIdempotencyKey {
				key = string(h.Value)
			}
		}
		if key == "" || seen[key] {
			continue
		}
		seen[key] = true
		keys = append(keys, key)
	}
	return len(keys), strings.Join(keys, ", ")
}

// crashAfterPublish is the store as a relay process sees it that dies right after
// the broker acknowledged a batch: the Complete that would delete the batch never
// happens, and nothing the dead process tries afterwards reaches the store.
type crashAfterPublish struct {
	store
	dead atomic.Bool // buckets drain in parallel
}

func (c *crashAfterPublish) Complete(context.Context, []*outbox.Envelope) error {
	c.dead.Store(true)
	return errCrash
}

func (c *crashAfterPublish) Release(ctx context.Context, held outbox.Lease) (bool, error) {
	if c.dead.Load() {
		return false, errCrash
	}
	return c.store.Release(ctx, held)
}

func (c *crashAfterPublish) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if c.dead.Load() {
		return errCrash
	}
	return c.store.StopRelay(ctx, relay, at)
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
