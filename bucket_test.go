package outbox_test

import (
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
)

// TestBucketOfMatchesKafkaPartitioner checks bucket hashing against franz-go's
// Kafka-compatible key partitioner, not against numbers computed by hand.
func TestBucketOfMatchesKafkaPartitioner(t *testing.T) {
	t.Parallel()
	kafka := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	rng := rand.New(rand.NewPCG(1, 2))
	keys := [][]byte{{}, []byte("a"), []byte("ab"), []byte("abc"), []byte("abcd"), []byte("order-42"), {0xff, 0x00, 0x80}}
	for range 2000 {
		k := make([]byte, rng.IntN(40))
		for i := range k {
			k[i] = byte(rng.UintN(256))
		}
		keys = append(keys, k)
	}
	for _, n := range []int{1, 2, 3, 8, 16, 31, 64, 1000} {
		for _, k := range keys {
			msg := outbox.Message{Topic: "t", Key: k}
			want := kafka.Partition(&kgo.Record{Key: k}, n)
			require.Equal(t, want, outbox.BucketOf(&msg, uuid.New(), n), "key %x, n %d", k, n)
		}
	}
}

func TestBucketOfPartitionAndKeyless(t *testing.T) {
	t.Parallel()
	p := int32(13)
	msg := outbox.Message{Topic: "t", Key: []byte("ignored"), Partition: &p}
	require.Equal(t, 5, outbox.BucketOf(&msg, uuid.New(), 8), "explicit partition modulo the count")

	// Keyless messages hash their ID: stable per ID, spread over the buckets.
	keyless := outbox.Message{Topic: "t"}
	seen := map[int]int{}
	for range 800 {
		id := uuid.Must(uuid.NewV7())
		b := outbox.BucketOf(&keyless, id, 8)
		require.Equal(t, b, outbox.BucketOf(&keyless, id, 8))
		seen[b]++
	}
	require.Len(t, seen, 8)
	for b, n := range seen {
		require.Greater(t, n, 50, "bucket %d gets a fair share of keyless messages", b)
	}
	// nil and empty keys are different: empty is a real key.
	empty := outbox.Message{Topic: "t", Key: []byte{}}
	kafka := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	require.Equal(t, kafka.Partition(&kgo.Record{Key: []byte{}}, 8), outbox.BucketOf(&empty, uuid.New(), 8))
}
