// Package tests holds the NATS transport's tests that need a NATS server with
// JetStream (OUTBOX_TEST_NATS_URL, default nats://127.0.0.1:4222). It is a package
// of its own so that an application's go mod tidy, which loads the tests of the
// packages it imports, never loads these.
package tests
