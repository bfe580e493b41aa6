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

// applied records the effects a consumer committed, through the memory store's
// OnCommit, so a rolled-back unit leaves nothing.
type applied struct {
	mu    sync.Mutex
	order []string
	count map[string]int
	dups  int
}

func newApplied() *applied { return &applied{count: map[string]int{}} }

func (a *applied) handler(fail func(d *inbox.Delivery) bool) inbox.Handler {
	return func(ctx context.Context, d *inbox.Delivery) error {
		if fail != nil && fail(d) {
			return fmt.Errorf("handler refuses %s for now", d.Payload)
		}
		payload := string(d.Payload)
		return memstore.OnCommit(ctx, func() error {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.order = append(a.order, payload)
			a.count[payload]++
			return nil
		})
	}
}

func (a *applied) processed(_ *inbox.Delivery, res inbox.Result) {
	if res.Duplicate {
		a.mu.Lock()
		a.dups++
		a.mu.Unlock()
	}
}

func (a *applied) snapshot() ([]string, map[string]int, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	count := make(map[string]int, len(a.count))
	for k, v := range a.count {
		count[k] = v
	}
	return append([]string(nil), a.order...), count, a.dups
}

// runConsumer starts an inbox consumer named name on stream's group "billing" and
// returns a stop function that cancels it and waits for Run to return nil.
func runConsumer(t *testing.T, client *redis.Client, stream, name string, a *applied, fail func(*inbox.Delivery) bool) func() {
	t.Helper()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	in, err := inbox.New(store, inbox.Config{Consumer: "billing", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src, err := redistransport.NewSource(client, redistransport.SourceConfig{Stream: stream, Group: "billing", Name: name})
	require.NoError(t, err)
	c, err := inbox.NewConsumer(src, in, a.handler(fail), inbox.ConsumerConfig{
		Processed: a.processed, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(60 * time.Second):
				t.Fatal("Run did not return after its ctx was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// The consumer processes the entries left pending under its name first, then the new
// ones, each once, in stream order; it retries a failing entry in place, skips the
// copy a relay's retry appended as a duplicate, and drops an entry that did not come
// through the outbox.
func TestConsumerAppliesOnceInOrder(t *testing.T) {
	t.Parallel()
	client := connect(t, redisAddr())
	stream := streamKey(t, client, "consume")
	require.NoError(t, client.XGroupCreateMkStream(t.Context(), stream, "billing", "0").Err())
	tr := newTransport(t, client, redistransport.Config{})
	var batch []*driver.Envelope
	for i := range 10 {
		batch = append(batch, envelope(t, outbox.Message{Topic: stream, Key: []byte("k"), Payload: fmt.Appendf(nil, "%d", i)}))
	}
	require.NoError(t, tr.Publish(t.Context(), batch[:3]))
	// An earlier run read the first three and crashed before acknowledging them.
	read, err := client.XReadGroup(t.Context(), &redis.XReadGroupArgs{Group: "billing", Consumer: "billing-1", Streams: []string{stream, ">"}, Count: 3}).Result()
	require.NoError(t, err)
	require.Len(t, read[0].Messages, 3)
	require.NoError(t, tr.Publish(t.Context(), batch[3:5]))
	require.NoError(t, client.XAdd(t.Context(), &redis.XAddArgs{Stream: stream, Values: []any{"payload", "not from the outbox"}}).Err())
	require.NoError(t, tr.Publish(t.Context(), append([]*driver.Envelope{batch[4]}, batch[5:]...)), "a retry appends batch[4] again")
	require.Equal(t, int64(12), length(t, client, stream))

	a := newApplied()
	var mu sync.Mutex
	failures := 0
	stop := runConsumer(t, client, stream, "billing-1", a, func(d *inbox.Delivery) bool {
		mu.Lock()
		defer mu.Unlock()
		if string(d.Payload) == "1" && failures < 2 {
			failures++
			return true
		}
		return false
	})
	require.Eventually(t, func() bool {
		order, _, dups := a.snapshot()
		return len(order) == 10 && dups == 1
	}, time.Minute, 10*time.Millisecond)
	stop()

	order, counts, dups := a.snapshot()
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}, order, "pending first, then stream order, the failing entry retried in place")
	for p, n := range counts {
		assert.Equal(t, 1, n, "entry %s applied once", p)
	}
	assert.Equal(t, 1, dups)
	assert.Equal(t, 2, failures)
	pending, err := client.XPending(t.Context(), stream, "billing").Result()
	require.NoError(t, err)
	assert.Zero(t, pending.Count, "every entry acknowledged")
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
