package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// watermillBroker publishes through transport/watermilltransport and Watermill's AMQP
// publisher (with delivery confirmation) to a durable queue of this run's own, named
// after the topic with a random suffix and deleted at Close, and reads the queue back
// through the adapter's marshaler, as a Watermill subscriber would.
type watermillBroker struct {
	*watermilltransport.Transport
	queue    string
	pub      *wamqp.Publisher
	conn     *amqp.Connection // the reader's connection
	ch       *amqp.Channel
	received []delivery
}

// openWatermillAMQP declares the queue and connects Watermill's publisher.
func openWatermillAMQP(_ context.Context, url string) (_ *watermillBroker, err error) {
	b := &watermillBroker{queue: topic + "." + uuid.NewString()[:8]}
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	if b.conn, err = amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)}); err != nil {
		return nil, fmt.Errorf("watermill: %w", err)
	}
	if b.ch, err = b.conn.Channel(); err != nil {
		return nil, fmt.Errorf("watermill: %w", err)
	}
	if _, err := b.ch.QueueDeclare(b.queue, true, false, false, false, nil); err != nil {
		return nil, fmt.Errorf("watermill: declare queue %s: %w", b.queue, err)
	}
	cfg := wamqp.NewDurableQueueConfig(url)
	cfg.Publish.ConfirmDelivery = true // published means the broker has it
	if b.pub, err = wamqp.NewPublisher(cfg, watermill.NopLogger{}); err != nil {
		return nil, fmt.Errorf("watermill: %w", err)
	}
	b.Transport, err = watermilltransport.New(b.pub, watermilltransport.Config{
		// The Watermill topic is the queue; the outbox topic travels in the metadata.
		Topic: func(*driver.Envelope) string { return b.queue },
		Ping: func(context.Context) error {
			if !b.pub.IsConnected() {
				return errors.New("not connected")
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (b *watermillBroker) Name() string { return "Watermill's AMQP publisher, queue " + b.queue }

// Received reads the queue until it is empty and returns every message read since
// the broker was opened.
func (b *watermillBroker) Received(ctx context.Context) ([]delivery, error) {
	for ctx.Err() == nil {
		d, ok, err := b.ch.Get(b.queue, true)
		if err != nil {
			return nil, fmt.Errorf("watermill: get: %w", err)
		}
		if !ok {
			break
		}
		msg, err := wamqp.DefaultMarshaler{}.Unmarshal(d)
		if err != nil {
			return nil, err
		}
		m, err := watermilltransport.Decode(msg)
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

func (b *watermillBroker) Close() error {
	var errs []error
	if b.pub != nil {
		errs = append(errs, b.pub.Close())
	}
	if b.ch != nil {
		_, _ = b.ch.QueueDelete(b.queue, false, false, false)
	}
	if b.conn != nil {
		if err := b.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
