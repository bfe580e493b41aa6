package watermilltransport_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// Through Watermill's in-process pub/sub: a message published twice is applied once,
// a handler error nacks it and its redelivery is applied, and a message that is not
// the outbox's fails with ErrInvalidMessage.
func TestHandlerAppliesOnce(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	in, err := inbox.New(store, inbox.Config{Consumer: "test"})
	require.NoError(t, err)

	var (
		mu      sync.Mutex
		applied = map[string]int{}
		refused = map[string]bool{}
	)
	var calls, withRaw atomic.Int64
	h, err := watermilltransport.Handler(in, func(ctx context.Context, d *inbox.Delivery) error {
		calls.Add(1)
		if m, ok := d.Raw.(*message.Message); ok && string(m.Payload) == string(d.Payload) && d.Attempt == 1 {
			withRaw.Add(1)
		}
		p := string(d.Payload)
		mu.Lock()
		first := p == "refused once" && !refused[p]
		refused[p] = true
		mu.Unlock()
		if first {
			return errors.New("not yet")
		}
		return memstore.OnCommit(ctx, func() error {
			mu.Lock()
			defer mu.Unlock()
			applied[p]++
			return nil
		})
	})
	require.NoError(t, err)

	ps := pubsub(t)
	tr := newTransport(t, ps, watermilltransport.Config{})
	once := envelope(t, outbox.Message{Topic: "t", Key: []byte("k"), Payload: []byte("twice published")})
	retried := envelope(t, outbox.Message{Topic: "t", Key: []byte("j"), Payload: []byte("refused once")})
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{once, retried}))
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{once}))

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msgs, err := ps.Subscribe(ctx, "t")
	require.NoError(t, err)
	var results []error
	for len(results) < 4 { // three messages and one redelivery
		select {
		case m := <-msgs:
			err := h(m)
			results = append(results, err)
			if err != nil {
				m.Nack()
			} else {
				m.Ack()
			}
		case <-ctx.Done():
			t.Fatalf("only %d deliveries", len(results))
		}
	}
	mu.Lock()
	assert.Equal(t, map[string]int{"twice published": 1, "refused once": 1}, applied)
	mu.Unlock()
	failed := 0
	for _, err := range results {
		if err != nil {
			failed++
		}
	}
	assert.Equal(t, 1, failed, "only the refused attempt failed: %v", results)

	assert.EqualValues(t, 3, calls.Load(), "the duplicate's function did not run")
	assert.Equal(t, calls.Load(), withRaw.Load(), "each delivery carries its Watermill message as Raw")

	err = h(message.NewMessage("foreign", []byte("x")))
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)

	_, err = watermilltransport.Handler(nil, nil)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
}
