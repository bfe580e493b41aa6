// Package tests holds the tests of package watermilltransport that need a broker:
// Watermill's AMQP publisher against a real RabbitMQ.
package tests

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// amqpURL is where the broker is (OUTBOX_TEST_AMQP_URL).
func amqpURL() string { return testenv.AMQPURL() }

var (
	brokerOnce sync.Once
	brokerErr  error
)

// needBroker fails the test under CI=true when no broker answers, and skips it
// otherwise.
func needBroker(tb testing.TB) {
	tb.Helper()
	brokerOnce.Do(func() {
		conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
		if err == nil {
			_ = conn.Close()
		}
		brokerErr = err
	})
	if brokerErr != nil {
		testenv.Missing(tb, "RabbitMQ", "OUTBOX_TEST_AMQP_URL", brokerErr)
	}
}

// urlVia returns the broker URL, through addr when it is not empty (a proxy).
func urlVia(tb testing.TB, addr string) string {
	u, err := url.Parse(amqpURL())
	require.NoError(tb, err)
	if addr != "" {
		u.Host = addr
	}
	return u.String()
}

// publisher builds Watermill's AMQP publisher in its durable-queue configuration (the
// topic is the queue, through the default exchange) with delivery confirmation, as
// an outbox needs, and quick reconnection; closed when the test ends.
func publisher(tb testing.TB, addr string) *wamqp.Publisher {
	tb.Helper()
	needBroker(tb)
	cfg := wamqp.NewDurableQueueConfig(urlVia(tb, addr))
	cfg.Publish.ConfirmDelivery = true
	// No channel pool: watermill-amqp v3.0.2's pool panics on Close after a
	// reconnection left a slot empty. Without one, each call opens a channel.
	cfg.Connection.Reconnect = &wamqp.ReconnectConfig{
		BackoffInitialInterval: 50 * time.Millisecond, BackoffMultiplier: 1.5, BackoffMaxInterval: time.Second,
	}
	if addr != "" {
		// Behind a proxy: a 2 s heartbeat gives up within seconds on a connection
		// that forwards nothing (the default, 10 s, takes half a minute).
		cfg.Connection.AmqpConfig = &amqp.Config{Heartbeat: 2 * time.Second}
	}
	pub, err := wamqp.NewPublisher(cfg, watermill.NopLogger{})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = pub.Close() })
	return pub
}

// newTransport wraps pub, pinging through its connection state.
func newTransport(tb testing.TB, pub *wamqp.Publisher, cfg watermilltransport.Config) *watermilltransport.Transport {
	tb.Helper()
	cfg.Ping = func(context.Context) error {
		if !pub.IsConnected() {
			return errors.New("not connected to the broker")
		}
		return nil
	}
	tr, err := watermilltransport.New(pub, cfg)
	require.NoError(tb, err)
	return tr
}

// admin is a connection of the test's own, for declaring and reading.
type admin struct {
	ch *amqp.Channel
}

func newAdmin(tb testing.TB) *admin {
	tb.Helper()
	needBroker(tb)
	conn, err := amqp.DialConfig(amqpURL(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(tb, err)
	return &admin{ch: ch}
}

func uniqueName(prefix string) string {
	return fmt.Sprintf("outbox-wm-%s-%s", prefix, uuid.NewString()[:8])
}

// queue declares a durable queue, deleted when the test ends.
func (a *admin) queue(tb testing.TB, name string, args amqp.Table) {
	tb.Helper()
	_, err := a.ch.QueueDeclare(name, true, false, false, false, args)
	require.NoError(tb, err)
	tb.Cleanup(func() { _, _ = a.ch.QueueDelete(name, false, false, false) })
}

// read gets n messages from queue as a Watermill subscriber would see them (the
// adapter's marshaler), decoded.
func (a *admin) read(tb testing.TB, queue string, n int) []watermilltransport.Delivery {
	tb.Helper()
	out := make([]watermilltransport.Delivery, 0, n)
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < n {
		d, ok, err := a.ch.Get(queue, true)
		require.NoError(tb, err)
		if !ok {
			require.True(tb, time.Now().Before(deadline), "only %d of %d messages arrived on %s", len(out), n, queue)
			time.Sleep(20 * time.Millisecond)
			continue
		}
		msg, err := wamqp.DefaultMarshaler{}.Unmarshal(d)
		require.NoError(tb, err)
		dec, err := watermilltransport.Decode(msg)
		require.NoError(tb, err)
		out = append(out, dec)
	}
	return out
}

func envelope(tb testing.TB, topic string, key, payload []byte) *driver.Envelope {
	tb.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: key, Payload: payload}, driver.DefaultBucketCount)
	require.NoError(tb, err)
	return env
}
