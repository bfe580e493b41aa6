package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
)

// countingTransport counts acknowledged messages and can make every publish slower.
type countingTransport struct {
	next      outbox.Transport
	delay     time.Duration
	published atomic.Int64
}

func (c *countingTransport) Publish(ctx context.Context, batch []*outbox.Envelope) error {
	if c.delay > 0 {
		t := time.NewTimer(c.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	err := c.next.Publish(ctx, batch)
	n := len(batch)
	var pe *outbox.PublishError
	switch {
	case err == nil:
	case errors.As(err, &pe):
		n -= len(pe.Failed)
	default:
		n = 0
	}
	c.published.Add(int64(n))
	return err
}
