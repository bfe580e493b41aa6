package kafkatransport_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
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
			require.Equal(t, want, driver.BucketOf(&msg, n), "key %x, n %d", k, n)
		}
	}
}
