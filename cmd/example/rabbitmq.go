package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/rabbitmq"
)

// rabbitBroker publishes through transport/rabbitmq to a fanout exchange named after
// the topic, bound to a durable queue of the same name, and reads the queue back.
type rabbitBroker struct {
	*rabbitmq.Transport
	url      string
	conn     *amqp.Connection // the reader's connection
	ch       *amqp.Channel
	received []delivery
}

// openRabbitMQ declares the exchange and the queue (if absent) and empties the queue
// of messages earlier runs left there.
func openRabbitMQ(ctx context.Context, url string) (_ *rabbitBroker, err error) {
	dial := func(context.Context) (*amqp.Connection, error) {
		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	}
	b := &rabbitBroker{url: url}
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	if b.conn, err = dial(ctx); err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	if b.ch, err = b.conn.Channel(); err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	if err := b.ch.ExchangeDeclare(topic, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("rabbitmq: declare exchange %s: %w", topic, err)
	}
	if _, err := b.ch.QueueDeclare(topic, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("rabbitmq: declare queue %s: %w", topic, err)
	}
	if err := b.ch.QueueBind(topic, "", topic, false, nil); err != nil {
		return nil, fmt.Errorf("rabbitmq: bind queue %s: %w", topic, err)
	}
	if _, err := b.ch.QueuePurge(topic, false); err != nil {
		return nil, fmt.Errorf("rabbitmq: purge queue %s: %w", topic, err)
	}
	if b.Transport, err = rabbitmq.New(dial, rabbitmq.Config{}); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *rabbitBroker) Name() string { return "RabbitMQ exchange " + topic }

// Received reads the queue until it is empty and returns every message read since
// the broker was opened.
func (b *rabbitBroker) Received(ctx context.Context) ([]delivery, error) {
	for ctx.Err() == nil {
		d, ok, err := b.ch.Get(topic, true)
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: get: %w", err)
		}
		if !ok {
			break
		}
		m, err := rabbitmq.Decode(d)
		if err != nil {
			return nil, err
		}
		idempotencyKey, _ := m.Header(outbox.HeaderIdempotencyKey)
		b.received = append(b.received, delivery{
			Topic: m.Topic, Key: m.Key, Payload: m.Payload,
			ID: m.ID.String(), IdempotencyKey: string(idempotencyKey),
		})
	}
	return slices.Clone(b.received), ctx.Err()
}

func (b *rabbitBroker) Close() error {
	var errs []error
	if b.Transport != nil {
		errs = append(errs, b.Transport.Close())
	}
	if b.conn != nil {
		if err := b.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
