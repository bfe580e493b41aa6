package tests

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// An earlier run under the same name read entries and stopped before acknowledging
// them: the next run hands those out first (marked redelivered), then the new ones,
// in stream order, and acknowledges every one.
func TestConsumerHandsOutPendingEntriesFirst(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	stream := streamKey(t, client, "pending")
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), stream, "billing", "0").Err())
	tr := newTransport(t, client, redistransport.Config{})
	var batch []*driver.Envelope
	for i := range 6 {
		batch = append(batch, envelope(t, outbox.Message{Topic: stream, Key: []byte("k"), Payload: fmt.Appendf(nil, "%d", i)}))
	}
	require.NoError(t, tr.Publish(t.Context(), batch[:3]))
	read, err := client.XReadGroup(t.Context(), &redis.XReadGroupArgs{Group: "billing", Consumer: "billing-1", Streams: []string{stream, ">"}, Count: 3}).Result()
	require.NoError(t, err)
	require.Len(t, read[0].Messages, 3)
	require.NoError(t, tr.Publish(t.Context(), batch[3:]))

	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	in, err := inbox.New(store, inbox.Config{Consumer: "billing", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src, err := redistransport.NewSource(client, redistransport.SourceConfig{Stream: stream, Group: "billing", Name: "billing-1"})
	require.NoError(t, err)
	var mu sync.Mutex
	var got []string
	var redelivered []bool
	c, err := inbox.NewConsumer(src, in, func(_ context.Context, d *inbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, string(d.Payload))
		redelivered = append(redelivered, d.Redelivered)
		return nil
	}, inbox.ConsumerConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	require.Eventually(t, func() bool {
		pending, err := client.XPending(t.Context(), stream, "billing").Result()
		mu.Lock()
		defer mu.Unlock()
		return err == nil && len(got) == 6 && pending.Count == 0
	}, time.Minute, 10*time.Millisecond, "every entry applied and acknowledged")
	cancel()
	require.NoError(t, <-done)
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5"}, got)
	assert.Equal(t, []bool{true, true, true, false, false, false}, redelivered)
}

func TestConsumerWithoutGroupIsMisconfigured(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	stream := streamKey(t, client, "nogroup")
	require.NoError(t, client.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: []any{"a", "b"}}).Err())
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	in, err := inbox.New(store, inbox.Config{Consumer: "c"})
	require.NoError(t, err)
	h := func(context.Context, *inbox.Delivery) error { return nil }
	_, err = redistransport.NewSource(client, redistransport.SourceConfig{Stream: stream, Group: "g"})
	assert.ErrorContains(t, err, "SourceConfig.Name")
	src, err := redistransport.NewSource(client, redistransport.SourceConfig{Stream: stream, Group: "g", Name: "n"})
	require.NoError(t, err)
	c, err := inbox.NewConsumer(src, in, h, inbox.ConsumerConfig{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.ErrorContains(t, err, "XGROUP CREATE")
}
