// Package tests holds the Redis transport's tests that need a Redis server
// (OUTBOX_TEST_REDIS_ADDR, default 127.0.0.1:6379). It is a package of its own so that
// an application's go mod tidy, which loads the tests of the packages it imports,
// never loads these.
package tests
