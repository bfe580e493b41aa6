package outbox_test

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
)

// Messages with one key always land in one bucket: the bucket Kafka's default
// partitioner would pick among as many partitions.
func ExampleBucketOf() {
	msg := outbox.Message{Topic: "orders", Key: []byte("customer-7")}
	fmt.Println(outbox.BucketOf(&msg, uuid.Nil, 8), outbox.BucketOf(&msg, uuid.Nil, 16))
	// Output: 7 7
}

// A scope carries Transactional sends to the unit of work that writes them.
func ExampleNewScope() {
	ctx, scope := outbox.NewScope(context.Background())
	defer scope.Release()

	env, _ := outbox.NewEnvelope(outbox.Message{Topic: "orders", Payload: []byte("placed")}, outbox.DefaultBucketCount)
	_ = outbox.ScopeFrom(ctx).Stage(env)

	// A store's unit of work takes the staged envelopes inside its transaction.
	staged := scope.Take()
	fmt.Println(len(staged), staged[0].Topic, scope.Len())
	// Output: 1 orders 0
}
