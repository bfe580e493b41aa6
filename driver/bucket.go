package driver

import "github.com/outboxkit/outbox"

// BucketOf returns the bucket of a message in a store with n buckets. It lands keys
// exactly where Kafka's default partitioner puts them among n partitions, so a topic
// with as many partitions as the outbox has buckets sees each bucket feed one
// partition:
//
//   - an explicit partition: partition modulo n;
//   - a key (empty included): murmur2(key), positive-masked, modulo n;
//   - keyless: the same hash of the message ID, spreading keyless messages evenly.
func BucketOf(msg *outbox.Message, n int) int {
	if n <= 1 {
		return 0
	}
	switch {
	case msg.Partition != nil:
		return int(*msg.Partition) % n
	case msg.Key != nil:
		return int(murmur2(msg.Key)&0x7fffffff) % n
	default:
		return int(murmur2(msg.ID[:])&0x7fffffff) % n
	}
}

// murmur2 is the 32-bit MurmurHash2 variant Kafka's Java client uses for keys.
func murmur2(b []byte) uint32 {
	const (
		seed = 0x9747b28c
		m    = 0x5bd1e995
		r    = 24
	)
	h := uint32(seed) ^ uint32(len(b))
	for ; len(b) >= 4; b = b[4:] {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
