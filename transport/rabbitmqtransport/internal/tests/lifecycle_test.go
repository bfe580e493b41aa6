package tests

import (
	"context"
	"runtime"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// A confirm window shorter than the broker takes to confirm abandons the channel in
// the background: the unconfirmed messages are reported failed, transient, and after
// Close no goroutine of the transport or its connections is left. The broker is
// reached through a proxy that delays everything by a second while the batch is
// published, so no confirm can arrive inside the window however busy the machine.
// (Not parallel: it counts goroutines.)
func TestConfirmTimeoutAndCloseLeaveNothingBehind(t *testing.T) {
	needBroker(t)
	a := newAdmin(t)
	topic := uniqueName("timeout")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	p := newProxy(t)
	runtime.GC()
	before := runtime.NumGoroutine()

	tr, err := rabbitmqtransport.New(dialer(p.Addr()), rabbitmqtransport.Config{ConfirmTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, tr.Ping(context.Background()), "connected before the delay")
	var batch []*driver.Envelope
	for range 50 {
		batch = append(batch, envelope(t, topic, []byte("k"), make([]byte, 1024)))
	}
	p.SetLatency(time.Second)
	failed := outboxtest.Failures(t, tr.Publish(context.Background(), batch))
	p.SetLatency(0)
	require.Len(t, failed, len(batch), "no confirm arrives within the window")
	for id, cause := range failed {
		assert.False(t, driver.IsPermanent(cause), "%s: %v", id, cause)
		assert.ErrorContains(t, cause, "Config.ConfirmTimeout")
	}
	require.NoError(t, tr.Ping(context.Background()), "a fresh channel after the abandoned one")
	require.NoError(t, tr.Close())
	require.ErrorIs(t, tr.Ping(context.Background()), outbox.ErrClosed)

	deadline := time.Now().Add(30 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after Close:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
