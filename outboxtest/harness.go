// Package outboxtest holds exported test kits for outbox stores and transports: the
// conformance suites every store and transport must pass, a recording transport, and
// fault-injecting wrappers. Third-party stores and transports run the same suites.
//
// A store passes [RunStoreTests] with a [StoreHarness]; a transport passes
// [RunTransportTests] with a [TransportHarness], which package relaysuite's Run also
// runs from its own harness. [Recorder] is a transport that keeps
// what it was asked to publish, for assertions and for benchmarks; [FaultTransport]
// wraps any transport and injects errors, latency and outages.
//
// # Semantics
//
//   - The suites test the contracts in package outbox, not an implementation: every
//     subtest gets a fresh store or fresh topics from the harness, and optional
//     capabilities ([driver.Admin], [driver.Finder], [driver.Retainer],
//     [driver.Notifier]) are tested when the store implements them and skipped with a
//     message when it does not.
//   - Lease and heartbeat times in the store suite are truncated to microseconds and
//     must round-trip exactly; envelope times must round-trip within a microsecond.
//   - A Recorder records clones in publish order and fails chosen messages on request;
//     a FaultTransport's random faults repeat for a given seed and publish order.
//
// # Limitations
//
//   - The store suite cannot see a store's transaction from outside: it checks that
//     the messages of a unit of work commit or roll back together, not the
//     application's own writes (each store's tests do that).
//   - The transport suite reads back through the harness's Read; what a transport
//     cannot express (an empty key next to a nil one, on some brokers) is declared in
//     the harness, not discovered.
//   - A Recorder keeps every message in memory; for long benchmarks set
//     [Recorder.CountOnly] or call [Recorder.Reset] between rounds.
package outboxtest

import (
	"context"
	"testing"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Store is what the suites need of a store's handle: what applications use
// ([outbox.Store]), its relay side ([driver.Handle]) and Close.
type Store interface {
	outbox.Store
	driver.Handle
	Close() error
}

// StoreHarness adapts one store to [RunStoreTests].
type StoreHarness struct {
	// New returns a fresh, empty, migrated store with bucketCount buckets, isolated
	// from every other store New returned (its own tables, key prefix or instance).
	// The suite closes it; New registers any other cleanup with t.Cleanup.
	New func(t *testing.T, bucketCount int) Store
	// Transact, if set, runs fn in the store's unit of work instead of the store's own
	// [outbox.Transactor.Transact]: a harness uses it to hold the transaction another
	// way, or to inject faults. Defaults to s.Transact.
	Transact func(ctx context.Context, s Store, fn func(ctx context.Context) error) error
	// Sequential runs the suite's subtests one at a time, for stores whose New cannot
	// run concurrently. By default they run in parallel.
	Sequential bool
	// AcceptsHeldIDs declares that the store does not refuse a message whose ID it
	// already holds (on DynamoDB the check would cost a guard item per message); the
	// suite then skips that check.
	AcceptsHeldIDs bool
}

// TransportHarness adapts one transport to [RunTransportTests].
type TransportHarness struct {
	// New returns a transport that publishes to the given topics (queues), which New
	// creates empty and isolated from other calls.
	New func(t *testing.T, topics ...string) driver.Transport
	// Read returns the next n messages that arrived on topic, in arrival order, failing
	// the test if they do not arrive in reasonable time.
	Read func(t *testing.T, topic string, n int) []Received
	// MaxMessageSize, if non-zero, is the transport's per-message limit; the suite
	// checks that a larger message fails permanently while the rest of its batch is
	// delivered.
	MaxMessageSize int
	// Ordered reports that messages of one key on one topic arrive in publish order.
	Ordered bool
	// EmptyIsNil reports that the transport cannot tell an empty key or payload from
	// a nil one (a missing key, a tombstone); the suite then compares their lengths
	// only. Leave it false when the broker keeps the difference, as Kafka does.
	EmptyIsNil bool
	// Sequential runs the suite's subtests one at a time. By default they run in
	// parallel.
	Sequential bool
}

// Received is a message read back from a broker, decoded by the transport's consumer
// helper.
type Received struct {
	// ID is the HeaderMessageID the transport stamped.
	ID      string
	Topic   string
	Key     []byte
	Payload []byte
	// Headers are the message's headers in order: the application's, those stamped at
	// capture (trace context, correlation id), and those the transport stamps
	// (HeaderMessageID, HeaderIdempotencyKey).
	Headers []outbox.Header
}
