package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/watermilltransport"
)

// A queue that refuses publishes when full makes the broker nack; Watermill's
// publisher fails the call, and every message of it is reported failed: transient by
// default, permanent when Config.Permanent says so. The first message of the call was
// confirmed and is in the queue all the same: a bridge cannot report per message.
// The relay suite (relay_test.go) covers connection outages under a relay; a broker
// that stays connected and refuses is RabbitMQ's queue limit, which only this test
// sets up.
func TestRefusedCallFailsWhole(t *testing.T) {
	t.Parallel()
	for _, permanent := range []bool{false, true} {
		t.Run(fmt.Sprint("permanent=", permanent), func(t *testing.T) {
			t.Parallel()
			a := newAdmin(t)
			topic := uniqueName("full")
			a.queue(t, topic, amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
			cfg := watermilltransport.Config{}
			if permanent {
				cfg.Permanent = func(err error) bool { return strings.Contains(err.Error(), "delivery not confirmed") }
			}
			tr := newTransport(t, publisher(t, ""), cfg)
			batch := []*driver.Envelope{
				envelope(t, topic, []byte("a"), []byte("1")),
				envelope(t, topic, []byte("b"), []byte("2")),
			}
			err := tr.Publish(context.Background(), batch)
			var pe *driver.PublishError
			require.ErrorAs(t, err, &pe)
			require.Len(t, pe.Failed, 2, "the call fails as a whole")
			for _, f := range pe.Failed {
				assert.Equal(t, permanent, driver.IsPermanent(f.Err), "%v", f.Err)
			}
			assert.Equal(t, batch[0].ID, a.read(t, topic, 1)[0].ID, "the confirmed part of the call is there: retrying it is a duplicate")
		})
	}
}
