package tests

import (
	"context"
	"errors"
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
)

// rawPublisher is the baseline: the raw client on a connection of its own, one
// channel in confirm mode, each message persistent and mandatory, published with
// PublishWithDeferredConfirm to the batch's exchange and every confirm waited on.
// It sets only the message id property and an id header; the transport also writes
// the key, the header order and the idempotency key.
func rawPublisher(tb testing.TB, _ driver.Transport) func(context.Context, []*driver.Envelope) error {
	conn, err := dialer("")(context.Background())
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(tb, err)
	require.NoError(tb, ch.Confirm(false))
	returns := ch.NotifyReturn(make(chan amqp.Return, 1024))
	return func(ctx context.Context, batch []*driver.Envelope) error {
		dcs := make([]*amqp.DeferredConfirmation, len(batch))
		for i, env := range batch {
			id := env.ID.String()
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, env.Topic, "", true, false, amqp.Publishing{
				Headers:      amqp.Table{outbox.HeaderMessageID: id},
				MessageId:    id,
				DeliveryMode: amqp.Persistent,
				Body:         env.Payload,
			})
			if err != nil {
				return err
			}
			dcs[i] = dc
		}
		for _, dc := range dcs {
			if !dc.Wait() {
				return errors.New("nacked")
			}
		}
		select {
		case r := <-returns:
			return fmt.Errorf("returned: %s", r.ReplyText)
		default:
			return nil
		}
	}
}

// BenchmarkPublish runs the relay suite's benchmark: the transport's Publish beside
// the raw client, to durable queues, and the relay draining a memory store through
// it:
//
//	go test -run '^$' -bench BenchmarkPublish -benchtime 300x -count 3 ./internal/tests/
func BenchmarkPublish(b *testing.B) {
	needBroker(b)
	relaysuite.Benchmark(b, relayHarness())
}
