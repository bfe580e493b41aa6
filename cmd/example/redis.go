package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// redisBroker appends through transport/redistransport to a stream of its own (the topic under
// a random prefix, deleted at Close) and reads it back with XRANGE.
type redisBroker struct {
	*redistransport.Transport
	addr     string
	client   *redis.Client
	stream   string
	last     string // the last entry id read
	received []delivery
}

func openRedis(ctx context.Context, addr string) (_ *redisBroker, err error) {
	prefix := "outbox-example-" + uuid.NewString()[:8] + ":"
	b := &redisBroker{addr: addr, stream: prefix + topic, last: "-"}
	b.client = redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 5 * time.Second})
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	if err := b.client.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	b.Transport, err = redistransport.New(b.client, redistransport.Config{
		Stream: func(topic string) string { return prefix + topic },
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (b *redisBroker) Name() string {
	return fmt.Sprintf("Redis stream %s at %s", b.stream, b.addr)
}

// Received reads the stream past the last entry read and returns every entry read
// since the broker was opened.
func (b *redisBroker) Received(ctx context.Context) ([]delivery, error) {
	for {
		start := b.last
		if start != "-" {
			start = "(" + start // exclusive
		}
		entries, err := b.client.XRangeN(ctx, b.stream, start, "+", 100).Result()
		if err != nil {
			return nil, fmt.Errorf("redis: XRANGE %s: %w", b.stream, err)
		}
		if len(entries) == 0 {
			return slices.Clone(b.received), nil
		}
		for _, e := range entries {
			d, err := redistransport.Decode(b.stream, e)
			if err != nil {
				return nil, err
			}
			idempotencyKey, _ := d.Header(outbox.HeaderIdempotencyKey)
			b.received = append(b.received, delivery{
				Topic: d.Topic, Key: d.Key, Payload: d.Payload,
				ID: d.ID.String(), IdempotencyKey: string(idempotencyKey),
			})
			b.last = e.ID
		}
	}
}

func (b *redisBroker) Close() error {
	if b.client == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.client.Del(ctx, b.stream).Err()
	return b.client.Close()
}
