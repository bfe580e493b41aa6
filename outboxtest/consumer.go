package outboxtest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/outbox/inbox"
)

// RunConsumer runs c in a goroutine until stop is called, and stop waits for Run to
// return, a minute at most, and returns Run's error. Stop may be called more than
// once; it is also called at tb's cleanup.
func RunConsumer(tb testing.TB, c *inbox.Consumer) (stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				err = errors.New("the consumer's Run did not return within a minute of its ctx ending")
			}
		})
		return err
	}
	tb.Cleanup(func() { _ = stop() })
	return stop
}
