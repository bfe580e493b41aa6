package main

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memory"
)

// backend is where the walkthrough keeps the application's orders and its outbox,
// and the broker the relay publishes to. Each scenario gets a fresh one. The memory
// backend needs no server; a database-backed one only has to implement these methods.
type backend interface {
	// Describe says in a few words what stands in for the database and the broker.
	Describe() string
	// Store is the outbox store.
	Store() store
	// Broker is where published messages end up.
	Broker() broker
	// SaveOrder writes an order on its own, as an application without the outbox does.
	SaveOrder(ctx context.Context, id string) error
	// CommitOrder is the unit of work: it writes the order and every envelope staged
	// on ctx's scope in one transaction. A non-nil fail stands for the handler failing
	// after its write: the transaction rolls back and CommitOrder returns fail.
	CommitOrder(ctx context.Context, id string, fail error) error
	// Orders lists the orders that were written, in order.
	Orders(ctx context.Context) ([]string, error)
	Close() error
}

// store is what the walkthrough needs of an outbox store: the relay side, and the
// admin side to count what waits in the outbox.
type store interface {
	outbox.RelayStore
	outbox.Admin
}

// broker is a transport the walkthrough can read back.
type broker interface {
	outbox.Transport
	Received(topic string) []outboxtest.Received
}

// memoryBackend keeps orders in a slice and the outbox in the memory store, and
// records what the relay publishes. The memory store stands in for a database that
// outlives the process: the walkthrough's "crashes" lose what a real crash loses
// (everything that was only in flight) and keep what a database would keep.
type memoryBackend struct {
	store  *memory.Store
	broker *outboxtest.Recorder

	mu     sync.Mutex
	orders []string
}

func newMemoryBackend() (backend, error) {
	store, err := memory.New(memory.Config{})
	if err != nil {
		return nil, err
	}
	return &memoryBackend{store: store, broker: outboxtest.NewRecorder()}, nil
}

func (b *memoryBackend) Describe() string {
	return "in-memory store and unit of work, a recording broker"
}

func (b *memoryBackend) Store() store   { return b.store }
func (b *memoryBackend) Broker() broker { return b.broker }

func (b *memoryBackend) SaveOrder(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.orders = append(b.orders, id)
	return nil
}

func (b *memoryBackend) CommitOrder(ctx context.Context, id string, fail error) error {
	return b.store.Commit(ctx, func() error {
		if fail != nil {
			return fail // the order is not kept, and the staged envelopes are not either
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if slices.Contains(b.orders, id) {
			return fmt.Errorf("order %s already exists", id)
		}
		b.orders = append(b.orders, id)
		return nil
	})
}

func (b *memoryBackend) Orders(context.Context) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.orders), nil
}

func (b *memoryBackend) Close() error { return b.store.Close() }
