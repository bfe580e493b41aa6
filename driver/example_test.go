package driver_test

import (
	"fmt"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Messages with one key always land in one bucket: the bucket Kafka's default
// partitioner would pick among as many partitions.
func ExampleBucketOf() {
	msg := outbox.Message{Topic: "orders", Key: []byte("customer-7")}
	fmt.Println(driver.BucketOf(&msg, 8), driver.BucketOf(&msg, 16))
	// Output: 7 7
}
