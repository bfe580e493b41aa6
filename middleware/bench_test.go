package middleware_test

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/store/memstore"
)

// BenchmarkCapture measures one send through a router to the capture on the memory
// store. "immediate" writes each send with Store.Enqueue outside a unit of work;
// "staged" stages each send on a scope, emptied every 100 sends, which is capture's
// own cost inside a unit of work; "unit of work" runs a Transact of 10 sends and
// reports the cost per send, commit included.
func BenchmarkCapture(b *testing.B) {
	msg := outbox.Message{
		Topic:   "orders",
		Key:     []byte("order-123"),
		Payload: make([]byte, 256),
		Headers: []outbox.Header{{Key: "content-type", Value: []byte("application/json")}},
	}

	b.Run("immediate", func(b *testing.B) {
		// A fresh store every 10,000 sends keeps the store's size, and so the cost of
		// its bookkeeping, the same however long the benchmark runs.
		var store *memstore.Store
		var r *middleware.Router
		fresh := func() {
			if store != nil {
				_ = store.Close()
			}
			store = benchStore(b)
			r = benchRouter(b, store, outbox.Immediate)
		}
		fresh()
		defer func() { _ = store.Close() }()
		ctx := b.Context()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if err := r.Send(ctx, msg); err != nil {
				b.Fatal(err)
			}
			if n++; n%10_000 == 0 {
				b.StopTimer()
				fresh()
				b.StartTimer()
			}
		}
	})

	b.Run("staged", func(b *testing.B) {
		store := benchStore(b)
		defer store.Close()
		r := benchRouter(b, store, outbox.Transactional)
		ctx, scope := outbox.NewScope(b.Context())
		defer func() { _, _ = driver.Take(ctx, 8); scope.Release() }() // leftovers are not abandoned sends
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if err := r.Send(ctx, msg); err != nil {
				b.Fatal(err)
			}
			if n++; n%100 == 0 {
				_, _ = driver.Take(ctx, 8)
			}
		}
	})

	b.Run("unit of work", func(b *testing.B) {
		const perUnit = 10
		var store *memstore.Store
		var r *middleware.Router
		fresh := func() {
			if store != nil {
				_ = store.Close()
			}
			store = benchStore(b)
			r = benchRouter(b, store, outbox.Transactional)
		}
		fresh()
		defer func() { _ = store.Close() }()
		unit := func(ctx context.Context) error {
			for range perUnit {
				if err := r.Send(ctx, msg); err != nil {
					return err
				}
			}
			return nil
		}
		ctx := b.Context()
		b.ReportAllocs()
		n := 0
		for b.Loop() {
			if err := store.Transact(ctx, unit); err != nil {
				b.Fatal(err)
			}
			if n++; n%1_000 == 0 {
				b.StopTimer()
				fresh()
				b.StartTimer()
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*perUnit), "ns/send")
	})
}

func benchStore(b *testing.B) *memstore.Store {
	b.Helper()
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		b.Fatal(err)
	}
	return store
}

func benchRouter(b *testing.B, store outbox.Store, mode outbox.WriteMode) *middleware.Router {
	b.Helper()
	sender, err := outbox.NewSender(store, outbox.SenderConfig{Mode: mode})
	if err != nil {
		b.Fatal(err)
	}
	r := middleware.NewRouter()
	r.Handle("orders", sender)
	return r
}
