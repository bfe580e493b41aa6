// Package outboxtest holds exported test kits for outbox stores and transports: the
// conformance suites every store and transport must pass, a recording transport, and
// fault-injecting wrappers. Third-party stores and transports run the same suites.
package outboxtest

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
)

// StoreHarness adapts one store (and one way of holding its transaction) to
// [RunStoreTests].
type StoreHarness struct {
	// New returns a fresh, empty store with bucketCount buckets, isolated from every
	// other store New returned (its own tables, key prefix or instance). The suite
	// closes it; New registers any other cleanup with t.Cleanup.
	New func(t *testing.T, bucketCount int) outbox.RelayStore
	// Transact runs fn inside the store's unit of work. ctx carries an [outbox.Scope];
	// fn stages envelopes on it. If fn returns nil, every staged envelope commits in
	// one transaction; if fn returns an error, nothing is written and Transact returns
	// that error.
	Transact func(ctx context.Context, s outbox.RelayStore, fn func(ctx context.Context) error) error
	// Sequential runs the suite's subtests one at a time, for stores whose New cannot
	// run concurrently. By default they run in parallel.
	Sequential bool
}

// TransportHarness adapts one transport to [RunTransportTests].
type TransportHarness struct {
	// New returns a transport that publishes to the given topics (queues), which New
	// creates empty and isolated from other calls.
	New func(t *testing.T, topics ...string) outbox.Transport
	// Read returns the next n messages that arrived on topic, in arrival order, failing
	// the test if they do not arrive in reasonable time.
	Read func(t *testing.T, topic string, n int) []Received
	// MaxMessageSize, if non-zero, is the transport's per-message limit; the suite
	// checks that a larger message fails permanently while the rest of its batch is
	// delivered.
	MaxMessageSize int
	// Ordered reports that messages of one key on one topic arrive in publish order.
	Ordered bool
}

// Received is a message read back from a broker, decoded by the transport's consumer
// helper.
type Received struct {
	// ID is the HeaderMessageID the transport stamped.
	ID      string
	Topic   string
	Key     []byte
	Payload []byte
	// Headers are the application's headers in order, including those the outbox
	// stamped at capture (idempotency-key, trace context) and HeaderMessageID.
	Headers []outbox.Header
}
