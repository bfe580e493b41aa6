package main

import (
	"cmp"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"

	"github.com/outboxkit/outbox/internal/testenv"
)

// amqpURL is OUTBOX_TEST_AMQP_URL, or the local RabbitMQ; a missing broker skips the
// test, or fails it under CI=true.
func amqpURL(t *testing.T) string {
	t.Helper()
	url := cmp.Or(os.Getenv("OUTBOX_TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ (OUTBOX_TEST_AMQP_URL)", err)
	}
	_ = conn.Close()
	return url
}

// TestWalkthroughOnRabbitMQ runs the -amqp path against the local broker; each run
// publishes to an exchange and a queue of its own, so runs side by side do not meet.
func TestWalkthroughOnRabbitMQ(t *testing.T) {
	t.Parallel()
	text := checkStory(t, options{AMQP: amqpURL(t)})
	assert.Contains(t, text, "messages go to RabbitMQ exchange "+topic+".")
}
