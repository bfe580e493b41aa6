package tests

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// applied records the effects a consumer committed, through the memory store's
// OnCommit, so a rolled-back unit leaves nothing.
type applied struct {
	mu    sync.Mutex
	order []string // payloads, in commit order
	count map[string]int
	dups  int
}

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

// consumer starts an inbox consumer on queue (through addr, if set) and returns a
// stop function that cancels it and waits for Run to return nil.
func consumer(t *testing.T, addr, queue string, a *applied, fail func(*inbox.Delivery) bool) func() {
	t.Helper()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	in, err := inbox.New(store, inbox.Config{Consumer: "test", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src, err := rabbitmqtransport.NewSource(dialer(addr), rabbitmqtransport.SourceConfig{Queue: queue})
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

func waitApplied(t *testing.T, a *applied, n int) {
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

func TestSourceConfig(t *testing.T) {
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	in, err := inbox.New(store, inbox.Config{Consumer: "c"})
	require.NoError(t, err)
	h := func(context.Context, *inbox.Delivery) error { return nil }
	_, err = rabbitmqtransport.NewSource(dialer(""), rabbitmqtransport.SourceConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "SourceConfig.Queue")
	_, err = rabbitmqtransport.NewSource(dialer(""), rabbitmqtransport.SourceConfig{Queue: "q", Prefetch: -1})
	require.ErrorContains(t, err, "SourceConfig.Prefetch")
	_, err = rabbitmqtransport.NewSource(nil, rabbitmqtransport.SourceConfig{Queue: "q"})
	require.ErrorContains(t, err, "Dialer")
	src, err := rabbitmqtransport.NewSource(dialer(""), rabbitmqtransport.SourceConfig{Queue: "q"})
	require.NoError(t, err)
	_, err = inbox.NewConsumer(src, nil, h, inbox.ConsumerConfig{})
	require.ErrorContains(t, err, "inbox")
	_, err = inbox.NewConsumer(src, in, h, inbox.ConsumerConfig{})
	require.NoError(t, err)
}

// Every message is applied once, in publish order, a redelivered copy is skipped as
// a duplicate, a message the handler refuses for a while is retried in place (holding
// back the ones behind it), and one that is not the outbox's is rejected; the queue
// ends empty.
func TestConsumerAppliesOnceInOrder(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("consume")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	tr := newTransport(t, "", rabbitmqtransport.Config{Route: func(env *driver.Envelope) (string, string) { return env.Topic, "" }})

	var batch []*driver.Envelope
	for i := range 20 {
		batch = append(batch, envelope(t, topic, []byte("k"), fmt.Appendf(nil, "%02d", i)))
	}
	require.NoError(t, tr.Publish(context.Background(), batch[:10]))
	require.NoError(t, tr.Publish(context.Background(), batch[3:4]), "a redelivery of message 03")
	require.NoError(t, a.ch.Publish(topic, "", false, false, amqp.Publishing{Body: []byte("not from the outbox")}))
	require.NoError(t, tr.Publish(context.Background(), batch[10:]))

	var attempts sync.Map
	fail := func(d *inbox.Delivery) bool { // 05 fails twice
		if string(d.Payload) != "05" {
			return false
		}
		n, _ := attempts.LoadOrStore("05", new(int))
		*n.(*int)++
		return *n.(*int) <= 2
	}
	app := &applied{count: map[string]int{}}
	stop := consumer(t, "", topic, app, fail)
	waitApplied(t, app, 20)
	deadline := time.Now().Add(30 * time.Second)
	for a.depth(t, topic) > 0 {
		require.True(t, time.Now().Before(deadline), "the queue empties")
		time.Sleep(20 * time.Millisecond)
	}
	stop()

	order, count, dups := app.snapshot()
	want := make([]string, 20)
	for i := range want {
		want[i] = fmt.Sprintf("%02d", i)
		assert.Equal(t, 1, count[want[i]], "message %s applied once", want[i])
	}
	assert.Equal(t, want, order, "applied in publish order, the retried one in its place")
	assert.Equal(t, 1, dups, "the redelivered copy is a duplicate")
}

// The connection is cut mid-stream: the consumer dials again, unacknowledged
// deliveries come again, and every message is applied exactly once. Run returns nil
// on cancel and leaves no goroutine behind. (Not parallel: it counts goroutines.)
func TestConsumerSurvivesBrokenConnection(t *testing.T) {
	a := newAdmin(t)
	topic := uniqueName("consume-cut")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	tr := newTransport(t, "", rabbitmqtransport.Config{Route: func(env *driver.Envelope) (string, string) { return env.Topic, "" }})
	p := newProxy(t)

	var batch []*driver.Envelope
	for i := range 200 {
		batch = append(batch, envelope(t, topic, fmt.Appendf(nil, "k%d", i%7), []byte(uuid.NewString())))
	}
	require.NoError(t, tr.Publish(context.Background(), batch))
	runtime.GC()
	before := runtime.NumGoroutine() // the transport's and the admin's connections included
	app := &applied{count: map[string]int{}}
	// Slow the handler a little so the cut lands mid-stream.
	slow := func(*inbox.Delivery) bool { time.Sleep(time.Millisecond); return false }
	stop := consumer(t, p.Addr(), topic, app, slow)
	waitApplied(t, app, 20)
	p.Cut()
	time.Sleep(300 * time.Millisecond)
	p.Restore()
	waitApplied(t, app, len(batch))
	stop()

	_, count, _ := app.snapshot()
	for _, env := range batch {
		assert.Equal(t, 1, count[string(env.Payload)], "message %s applied once", env.ID)
	}
	assert.Zero(t, a.depth(t, topic), "everything was acknowledged")

	p.Cut() // the proxy's own goroutines end with its connections
	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Run returned:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
