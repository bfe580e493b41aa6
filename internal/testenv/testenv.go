// Package testenv tells the tests where the services they talk to are, and what a
// missing one means: a failure under CI=true, a skip with a message elsewhere.
package testenv

import (
	"cmp"
	"os"
	"testing"
)

// PostgresURL is OUTBOX_TEST_POSTGRES_URL, or the local PostgreSQL's test database.
func PostgresURL() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_POSTGRES_URL"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// MySQLDSN is OUTBOX_TEST_MYSQL_DSN, or the local MariaDB's test database.
func MySQLDSN() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_MYSQL_DSN"), "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC")
}

// NATSURL is OUTBOX_TEST_NATS_URL, or the local NATS server (with JetStream).
func NATSURL() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_NATS_URL"), "nats://127.0.0.1:4222")
}

// RedisAddr is OUTBOX_TEST_REDIS_ADDR, or the local Redis.
func RedisAddr() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_REDIS_ADDR"), "127.0.0.1:6379")
}

// AMQPURL is OUTBOX_TEST_AMQP_URL, or the local RabbitMQ's default virtual host.
func AMQPURL() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
}

// Unavailable fails the test under CI=true, where every service must be there, and
// skips it otherwise, saying what was missing and why: a SQL database.
func Unavailable(tb testing.TB, what string, err error) {
	tb.Helper()
	Missing(tb, what, "OUTBOX_TEST_POSTGRES_URL or OUTBOX_TEST_MYSQL_DSN", err)
}

// Missing fails the test under CI=true, where every service must be there, and
// skips it otherwise, saying what was missing, why, and which variable (env) points
// the tests at another.
func Missing(tb testing.TB, what, env string, err error) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("%s is required under CI=true: %v", what, err)
	}
	tb.Skipf("%s is not available (%v); start it, or point %s at one, to run this test", what, err, env)
}
