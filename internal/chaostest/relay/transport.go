package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// countingTransport counts acknowledged messages and can make every publish slower:
// delay before the publish, ackDelay after the broker acknowledged it and before the
// relay hears of it. It announces each acknowledgement on stdout ("acked N")
// before that wait, so a test can kill the process while the broker holds a batch
// the store has not forgotten. It passes on the inner transport's Ping and
// KeepsKeyOrder, so the relay batches and fails over as it does on the transport
// alone.
type countingTransport struct {
	next      driver.Transport
	delay     time.Duration
	ackDelay  time.Duration
	published atomic.Int64
	out       *syncWriter
}

func (c *countingTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
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
	var pe *driver.PublishError
	switch {
	case err == nil:
	case errors.As(err, &pe):
		n -= len(pe.Failed)
	default:
		n = 0
	}
	c.published.Add(int64(n))
	if n > 0 && c.ackDelay > 0 {
		c.out.printf("acked %d\n", n)
		t := time.NewTimer(c.ackDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	return err
}

// Ping implements driver.Pinger when the inner transport does.
func (c *countingTransport) Ping(ctx context.Context) error {
	if p, ok := c.next.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return errors.ErrUnsupported
}

// KeepsKeyOrder implements driver.KeyOrderKeeper as the inner transport does.
func (c *countingTransport) KeepsKeyOrder() bool {
	k, ok := c.next.(driver.KeyOrderKeeper)
	return ok && k.KeepsKeyOrder()
}

// syncWriter serialises lines written to stdout from several goroutines.
type syncWriter struct{ mu sync.Mutex }

func (w *syncWriter) printf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Printf(format, args...)
}
