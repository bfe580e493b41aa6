package tests

import (
	"context"
	"errors"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/rabbitmqtransport"
)

// The connection breaks between two calls: the call during the outage fails without
// claiming anything was sent, and the transport dials again once the broker is back.
// Every message reported sent is in the queue. The relay suite (relay_test.go) runs
// the same outage under a relay; this test pins down the single call, which a relay
// retries before it can be seen.
func TestReconnectAfterBrokenConnection(t *testing.T) {
	t.Parallel()
	a := newAdmin(t)
	topic := uniqueName("reconnect")
	a.exchange(t, topic, amqp.ExchangeFanout)
	a.queue(t, topic, topic, "", nil)
	p := newProxy(t)
	tr := newTransport(t, p.Addr(), rabbitmqtransport.Config{})

	first := envelope(t, topic, []byte("k"), []byte("1"))
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{first}))

	p.Cut()
	during := envelope(t, topic, []byte("k"), []byte("2"))
	err := tr.Publish(context.Background(), []*driver.Envelope{during})
	require.Error(t, err, "nothing reaches a cut broker")
	var pe *driver.PublishError
	if errors.As(err, &pe) {
		for _, f := range pe.Failed {
			assert.False(t, driver.IsPermanent(f.Err), "a broken connection is transient: %v", f.Err)
		}
	}

	p.Restore()
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{during}), "the transport redials")
	got := a.read(t, topic, 2)
	assert.Equal(t, first.ID, got[0].ID)
	assert.Equal(t, during.ID, got[1].ID)
}
