package main

import (
	"context"
	"fmt"

	"github.com/outboxkit/outbox/driver"
)

// broker is where the relay publishes, and where the walkthrough reads the messages
// back as a consumer would.
type broker interface {
	// Transport is what the relay publishes through: transport/kafkatransport or transport/sqstransport.
	driver.Transport
	// SizeLimiter is the transport's per-message limit, which senders check.
	driver.SizeLimiter
	// Name says in a few words which broker this is.
	Name() string
	// Received returns every message published since the broker was opened.
	Received(ctx context.Context) ([]delivery, error)
	Close() error
}

// delivery is a message read back from the broker, decoded by the transport
// package's consumer helper.
type delivery struct {
	Topic          string
	Key            []byte
	Payload        []byte
	ID             string // the outbox message id
	IdempotencyKey string
}

func (d delivery) String() string {
	return fmt.Sprintf("topic %s, key %s, payload %s\n       message id %s, idempotency-key %s",
		d.Topic, d.Key, d.Payload, d.ID, d.IdempotencyKey)
}

// openBroker opens the broker opts choose.
func openBroker(ctx context.Context, opts options) (broker, error) {
	if opts.AMQP != "" {
		return openRabbitMQ(ctx, opts.AMQP)
	}
	if opts.NATS != "" {
		return openNATS(ctx, opts.NATS)
	}
	if opts.Redis != "" {
		return openRedis(ctx, opts.Redis)
	}
	if opts.Watermill != "" {
		return openWatermillAMQP(ctx, opts.Watermill)
	}
	if opts.SQSEndpoint != "" {
		return openSQS(ctx, opts.SQSEndpoint, opts.SQSQueue)
	}
	return openKafka(ctx, opts.Kafka)
}
