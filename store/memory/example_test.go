package memory_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/memory"
)

// Commit writes the staged sends and the application's own state change together:
// both or neither.
func ExampleStore_Commit() {
	ctx := context.Background()
	store, _ := memory.New(memory.Config{})
	defer store.Close()

	balances := map[string]int{"alice": 100}

	// A request handler: open a scope, capture a send (a Transactional route stages
	// it), then commit the state change and the send as one unit of work.
	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	env, _ := outbox.NewEnvelope(outbox.Message{Topic: "payments", Key: []byte("alice"), Payload: []byte(`{"debit":30}`)}, store.BucketCount())
	_ = scope.Stage(env)

	err := store.Commit(ctx, func() error {
		balances["alice"] -= 30
		return nil
	})
	fmt.Println("commit:", err)

	// A second attempt whose state change fails: its send is discarded with it.
	env2, _ := outbox.NewEnvelope(outbox.Message{Topic: "payments", Key: []byte("alice"), Payload: []byte(`{"debit":500}`)}, store.BucketCount())
	_ = scope.Stage(env2)
	err = store.Commit(ctx, func() error {
		if balances["alice"] < 500 {
			return errors.New("insufficient funds")
		}
		balances["alice"] -= 500
		return nil
	})
	fmt.Println("commit:", err)

	stats, _ := store.Stats(ctx)
	total := 0
	for _, n := range stats.Pending {
		total += n
	}
	fmt.Println("balance:", balances["alice"], "pending sends:", total)
	// Output:
	// commit: <nil>
	// commit: insufficient funds
	// balance: 70 pending sends: 1
}

// Transact commits what fn staged, or nothing when fn fails.
func ExampleStore_Transact() {
	ctx := context.Background()
	store, _ := memory.New(memory.Config{BucketCount: 1})
	defer store.Close()

	send := func(ctx context.Context, payload string) error {
		env, err := outbox.NewEnvelope(outbox.Message{Topic: "orders", Payload: []byte(payload)}, store.BucketCount())
		if err != nil {
			return err
		}
		return outbox.ScopeFrom(ctx).Stage(env)
	}

	err := store.Transact(ctx, func(ctx context.Context) error {
		return send(ctx, "order 1 placed")
	})
	fmt.Println("first:", err)

	err = store.Transact(ctx, func(ctx context.Context) error {
		if err := send(ctx, "order 2 placed"); err != nil {
			return err
		}
		return errors.New("validation failed")
	})
	fmt.Println("second:", err)

	envs, _ := store.Fetch(ctx, 0, 10)
	for _, env := range envs {
		fmt.Printf("stored: seq %d %s\n", env.Seq, env.Payload)
	}
	// Output:
	// first: <nil>
	// second: validation failed
	// stored: seq 1 order 1 placed
}
