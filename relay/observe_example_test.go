package relay_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// topicCounter counts completed messages per topic: an Observer for a metrics
// library of one's own. NopObserver supplies the methods it does not need.
type topicCounter struct {
	relay.NopObserver
	mu     sync.Mutex
	counts map[string]int
}

func (c *topicCounter) Completed(_ context.Context, envs []*driver.Envelope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range envs {
		c.counts[e.Topic]++
	}
}

func ExampleObserver() {
	ctx := context.Background()
	store, _ := memstore.New(memstore.Config{})
	defer store.Close()
	for _, topic := range []string{"orders", "invoices", "orders"} {
		_ = store.Enqueue(ctx, outbox.Message{Topic: topic, Payload: []byte("x")})
	}

	counter := &topicCounter{counts: map[string]int{}}
	d, err := relay.New(store, outboxtest.NewRecorder(), relay.Config{
		Observer: counter,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := d.RunOnce(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("orders:", counter.counts["orders"], "invoices:", counter.counts["invoices"])
	// Output:
	// orders: 2 invoices: 1
}
