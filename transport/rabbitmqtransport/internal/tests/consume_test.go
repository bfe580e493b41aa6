package tests

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

func TestSourceConfig(t *testing.T) {
	_, err := rabbitmqtransport.NewSource(dialer(""), rabbitmqtransport.SourceConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "SourceConfig.Queue")
	_, err = rabbitmqtransport.NewSource(dialer(""), rabbitmqtransport.SourceConfig{Queue: "q", Prefetch: -1})
	require.ErrorContains(t, err, "SourceConfig.Prefetch")
	_, err = rabbitmqtransport.NewSource(nil, rabbitmqtransport.SourceConfig{Queue: "q"})
	require.ErrorContains(t, err, "Dialer")
	_, err = rabbitmqtransport.NewSource(dialer(""), rabbitmqtransport.SourceConfig{Queue: "q"})
	require.NoError(t, err)
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
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	in, err := inbox.New(store, inbox.Config{Consumer: "test", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src, err := rabbitmqtransport.NewSource(dialer(p.Addr()), rabbitmqtransport.SourceConfig{Queue: topic})
	require.NoError(t, err)
	l := outboxtest.NewLedger()
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		time.Sleep(time.Millisecond) // slow enough that the cut lands mid-stream
		return l.Apply(ctx, d)
	}, inbox.ConsumerConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	stop := outboxtest.RunConsumer(t, c)
	require.Eventually(t, func() bool { return l.Len() >= 20 }, time.Minute, 5*time.Millisecond)
	p.Cut()
	time.Sleep(300 * time.Millisecond)
	p.Restore()
	require.Eventually(t, func() bool { return l.Len() == len(batch) }, 2*time.Minute, 10*time.Millisecond)
	require.NoError(t, stop(), "Run returns nil once its ctx ends")

	applied, _ := l.Snapshot()
	for _, env := range batch {
		assert.Equal(t, 1, applied[env.ID.String()], "message %s applied once", env.ID)
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
