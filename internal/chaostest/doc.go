// Package chaostest runs the chaos harness of package
// github.com/outboxkit/outbox/outboxtest/chaos on every store, kills and stops real
// relay processes (built from ./relay) against PostgreSQL and Kafka, puts the SQL
// store's log mode through a killed stream reader, a broker cut off and a poison key
// (on PostgreSQL clusters of its own with wal_level=logical), and checks that bad
// input gets a clear error and loses nothing on every store. It holds tests only.
//
// # Semantics
//
//   - The default runs are sized for CI: a few thousand messages and three relays per
//     store. OUTBOX_CHAOS_LARGE=1 runs 100,000 messages per store with six relays
//     and a longer fault schedule.
//   - Under CI=true a missing PostgreSQL or MariaDB fails the tests; otherwise they
//     are skipped with a message.
//
// # Limitations
//
//   - The process-kill test needs a Go toolchain at test time: it builds the relay
//     binary with go build.
package chaostest
