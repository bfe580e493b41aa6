package tests

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/natstransport"
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

func (a *applied) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		order, _, _ := a.snapshot()
		if len(order) >= n {
			return
		}
		require.True(t, time.Now().Before(deadline), "only %d of %d applied", len(order), n)
		time.Sleep(10 * time.Millisecond)
	}
}

// runConsumer starts an inbox consumer on a durable consumer of s and returns a stop
// function that cancels it and waits for Run to return nil.
func runConsumer(t *testing.T, s jetstream.Stream, a *applied, fail func(*inbox.Delivery) bool) func() {
	t.Helper()
	cons, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	in, err := inbox.New(store, inbox.Config{Consumer: "billing", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src, err := natstransport.NewSource(cons, natstransport.SourceConfig{})
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

// The consumer applies every message once, in stream order, retries a failing one in
// place (holding back the rest), skips a copy stored twice as a duplicate, and
// terminates a message that did not come through the outbox.
func TestConsumerAppliesOnceInOrder(t *testing.T) {
	t.Parallel()
	nc, js := connect(t, natsURL())
	subject := streamName("consume")
	// The shortest duplicate window, so that a republished copy is stored twice.
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{subject}, Duplicates: 100 * time.Millisecond})
	tr := newTransport(t, js, natstransport.Config{})
	var batch []*driver.Envelope
	for i := range 10 {
		batch = append(batch, envelope(t, outbox.Message{Topic: subject, Key: []byte("k"), Payload: fmt.Appendf(nil, "%d", i)}))
	}
	require.NoError(t, tr.Publish(t.Context(), batch[:5]))
	require.NoError(t, nc.Publish(subject, []byte("not from the outbox")))
	time.Sleep(300 * time.Millisecond) // past the window: the copy below is stored
	require.NoError(t, tr.Publish(t.Context(), append([]*driver.Envelope{batch[4]}, batch[5:]...)))
	require.Equal(t, uint64(12), count(t, s))

	a := newApplied()
	var mu sync.Mutex
	failures := 0
	stop := runConsumer(t, s, a, func(d *inbox.Delivery) bool {
		mu.Lock()
		defer mu.Unlock()
		if string(d.Payload) == "2" && failures < 2 {
			failures++
			return true
		}
		return false
	})
	a.wait(t, 10)
	require.Eventually(t, func() bool { _, _, dups := a.snapshot(); return dups == 1 }, time.Minute, 10*time.Millisecond)
	stop()

	order, counts, dups := a.snapshot()
	assert.Equal(t, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}, order, "stream order, the failing message retried in place")
	for p, n := range counts {
		assert.Equal(t, 1, n, "message %s applied once", p)
	}
	assert.Equal(t, 1, dups, "the second copy is a duplicate")
	assert.Equal(t, 2, failures)

	info, err := s.Consumer(t.Context(), "billing")
	require.NoError(t, err)
	got, err := info.Info(t.Context())
	require.NoError(t, err)
	assert.Zero(t, got.NumAckPending, "every message settled (acknowledged, or terminated)")
	assert.Zero(t, got.NumPending)
}

func TestSourceConfig(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{streamName("cfg")}})
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	in, err := inbox.New(store, inbox.Config{Consumer: "c"})
	require.NoError(t, err)
	h := func(context.Context, *inbox.Delivery) error { return nil }
	none, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "none", AckPolicy: jetstream.AckNonePolicy})
	require.NoError(t, err)
	_, err = natstransport.NewSource(none, natstransport.SourceConfig{})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.ErrorContains(t, err, "AckExplicitPolicy")
	explicit, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "explicit", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	_, err = natstransport.NewSource(explicit, natstransport.SourceConfig{FetchBatch: -1})
	assert.ErrorContains(t, err, "SourceConfig.FetchBatch")
	_, err = natstransport.NewSource(nil, natstransport.SourceConfig{})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	src, err := natstransport.NewSource(explicit, natstransport.SourceConfig{})
	require.NoError(t, err)
	_, err = inbox.NewConsumer(src, nil, h, inbox.ConsumerConfig{})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = inbox.NewConsumer(src, in, h, inbox.ConsumerConfig{})
	assert.NoError(t, err)
}
