// Package tests holds the tests of package rabbitmqtransport that need a RabbitMQ broker.
package tests

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/outboxtest/netfault"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
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

// dialer dials the broker, through addr when it is not empty (a proxy's address).
func dialer(addr string) rabbitmqtransport.Dialer {
	return func(ctx context.Context) (*amqp.Connection, error) {
		u, err := url.Parse(amqpURL())
		if err != nil {
			return nil, err
		}
		if addr != "" {
			u.Host = addr
		}
		return amqp.DialConfig(u.String(), amqp.Config{Dial: amqp.DefaultDial(5 * time.Second), Heartbeat: 2 * time.Second})
	}
}

// newTransport builds a transport on the broker (through addr, if set), closed when
// the test ends.
func newTransport(t testing.TB, addr string, cfg rabbitmqtransport.Config) *rabbitmqtransport.Transport {
	t.Helper()
	needBroker(t)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	tr, err := rabbitmqtransport.New(dialer(addr), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })
	return tr
}

// admin is a connection of the test's own, for declaring and reading.
type admin struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

func newAdmin(t testing.TB) *admin {
	t.Helper()
	needBroker(t)
	conn, err := dialer("")(context.Background())
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return &admin{conn: conn, ch: ch}
}

func uniqueName(prefix string) string {
	return fmt.Sprintf("outbox-test-%s-%s", prefix, uuid.NewString()[:8])
}

// exchange declares an exchange of kind, deleted when the test ends.
func (a *admin) exchange(t testing.TB, name, kind string) {
	t.Helper()
	require.NoError(t, a.ch.ExchangeDeclare(name, kind, false, false, false, false, nil))
	t.Cleanup(func() { _ = a.ch.ExchangeDelete(name, false, false) })
}

// queue declares a durable queue bound to exchange with key (when exchange is set),
// deleted when the test ends.
func (a *admin) queue(t testing.TB, name, exchange, key string, args amqp.Table) {
	t.Helper()
	_, err := a.ch.QueueDeclare(name, true, false, false, false, args)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = a.ch.QueueDelete(name, false, false, false) })
	if exchange != "" {
		require.NoError(t, a.ch.QueueBind(name, key, exchange, false, nil))
	}
}

// read gets n messages from queue, decoded, failing if they do not arrive within a
// generous deadline.
func (a *admin) read(t testing.TB, queue string, n int) []rabbitmqtransport.Delivery {
	t.Helper()
	out := make([]rabbitmqtransport.Delivery, 0, n)
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < n {
		d, ok, err := a.ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			require.True(t, time.Now().Before(deadline), "only %d of %d messages arrived on %s", len(out), n, queue)
			time.Sleep(20 * time.Millisecond)
			continue
		}
		dec, err := rabbitmqtransport.Decode(d)
		require.NoError(t, err)
		out = append(out, dec)
	}
	return out
}

// depth reports how many messages wait in queue.
func (a *admin) depth(t testing.TB, queue string) int {
	t.Helper()
	q, err := a.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

func envelope(t testing.TB, topic string, key, payload []byte) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: key, Payload: payload}, driver.DefaultBucketCount)
	require.NoError(t, err)
	return env
}

// newProxy puts a TCP proxy in front of the broker, so a test can cut the connection.
func newProxy(tb testing.TB) *netfault.Proxy {
	tb.Helper()
	u, err := url.Parse(amqpURL())
	require.NoError(tb, err)
	return netfault.New(tb, u.Host)
}
