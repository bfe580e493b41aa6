package main

import (
	"cmp"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/internal/testenv"
)

// TestWalkthroughOnWatermill runs the -watermill-amqp path against the local broker,
// with a message an earlier run left in the queue: the walkthrough purges it and
// counts only its own messages.
func TestWalkthroughOnWatermill(t *testing.T) {
	url := cmp.Or(os.Getenv("OUTBOX_TEST_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ (OUTBOX_TEST_AMQP_URL)", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(topic, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Publish("", topic, false, false, amqp.Publishing{Body: []byte("left over")}))

	text := checkStory(t, options{Watermill: url})
	assert.Contains(t, text, "messages go to Watermill's AMQP publisher, queue "+topic)

	_, err = ch.QueueDelete(topic, false, false, false)
	require.NoError(t, err)
}
