package driver_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

func TestBucketOfPartitionAndKeyless(t *testing.T) {
	t.Parallel()
	p := int32(13)
	msg := outbox.Message{Topic: "t", Key: []byte("ignored"), Partition: &p}
	require.Equal(t, 5, driver.BucketOf(&msg, 8), "explicit partition modulo the count")

	// Keyless messages hash their ID: stable per ID, spread over the buckets.
	keyless := outbox.Message{Topic: "t"}
	seen := map[int]int{}
	for range 800 {
		keyless.ID = uuid.Must(uuid.NewV7())
		b := driver.BucketOf(&keyless, 8)
		require.Equal(t, b, driver.BucketOf(&keyless, 8))
		seen[b]++
	}
	require.Len(t, seen, 8)
	for b, n := range seen {
		require.Greater(t, n, 50, "bucket %d gets a fair share of keyless messages", b)
	}
	// nil and empty keys are different: empty is a real key, one bucket whatever the
	// ID (transport/kafkatransport checks it is the bucket Kafka's partitioner picks).
	empty := outbox.Message{Topic: "t", Key: []byte{}}
	want := driver.BucketOf(&empty, 8)
	for range 100 {
		empty.ID = uuid.New()
		require.Equal(t, want, driver.BucketOf(&empty, 8))
	}
}
