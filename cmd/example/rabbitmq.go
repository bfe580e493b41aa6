package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// rabbitBroker publishes through transport/rabbitmqtransport to a fanout exchange of this run's
// own, named after the topic with a random suffix (so that runs side by side do not
// read each other's messages), bound to a durable queue of the same name, and reads
// the queue back. Both are deleted at Close.
type rabbitBroker struct {
	*rabbitmqtransport.Transport
	name     string           // the exchange's and the queue's
	conn     *amqp.Connection // the reader's connection
	ch       *amqp.Channel
	received []delivery
}

// openRabbitMQ declares the exchange and the queue.
func openRabbitMQ(ctx context.Context, url string) (_ *rabbitBroker, err error) {
	dial := func(context.Context) (*amqp.Connection, error) {
		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	}
	b := &rabbitBroker{name: topic + "." + uuid.NewString()[:8]}
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
	if err := b.ch.ExchangeDeclare(b.name, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("rabbitmq: declare exchange %s: %w", b.name, err)
	}
	if _, err := b.ch.QueueDeclare(b.name, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("rabbitmq: declare queue %s: %w", b.name, err)
	}
	if err := b.ch.QueueBind(b.name, "", b.name, false, nil); err != nil {
		return nil, fmt.Errorf("rabbitmq: bind queue %s: %w", b.name, err)
	}
	// The topic travels in a header, so Decode still names it.
	route := func(*driver.Envelope) (string, string) { return b.name, "" }
	if b.Transport, err = rabbitmqtransport.New(dial, rabbitmqtransport.Config{Route: route}); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *rabbitBroker) Name() string { return "RabbitMQ exchange " + b.name }

// Received reads the queue until it is empty and returns every message read since
// the broker was opened.
func (b *rabbitBroker) Received(ctx context.Context) ([]delivery, error) {
	for ctx.Err() == nil {
		d, ok, err := b.ch.Get(b.name, true)
		if err != nil {
			return nil, fmt.Errorf("rabbitmq: get: %w", err)
		}
		if !ok {
			break
		}
		m, err := rabbitmqtransport.Decode(d)
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
	if b.ch != nil {
		_, _ = b.ch.QueueDelete(b.name, false, false, false)
		_ = b.ch.ExchangeDelete(b.name, false, false)
	}
	if b.conn != nil {
		if err := b.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
