package tests

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// TestRelayRefusesAnAckTimeoutThatOutlastsTheLease: the transport reports its ack
// timeout as the longest a publish waits, so relay.New refuses timings where a publish
// cannot finish inside a lease (LeaseDuration − LeaseRenewInterval), and accepts the
// defaults together.
func TestRelayRefusesAnAckTimeoutThatOutlastsTheLease(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name           string
		ack            time.Duration
		lease, renew   time.Duration
		refused        bool
		publishTimeout time.Duration
	}{
		{"defaults", 0, 0, 0, false, kafkatransport.DefaultAckTimeout},
		{"default ack, 10 s lease", 0, 10 * time.Second, 3 * time.Second, true, kafkatransport.DefaultAckTimeout},
		{"ack equal to the lease's room", 7 * time.Second, 10 * time.Second, 3 * time.Second, true, 7 * time.Second},
		{"ack within a 10 s lease", 5 * time.Second, 10 * time.Second, 3 * time.Second, false, 5 * time.Second},
		{"no ack timeout: the relay's context bounds it", -1, 10 * time.Second, 3 * time.Second, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl, err := kgo.NewClient() // never dials until used
			require.NoError(t, err)
			t.Cleanup(cl.Close)
			tr, err := kafkatransport.New(cl, kafkatransport.Config{AckTimeout: tc.ack})
			require.NoError(t, err)
			assert.Equal(t, tc.publishTimeout, tr.PublishTimeout())

			store, err := memstore.New(memstore.Config{BucketCount: 2})
			require.NoError(t, err)
			t.Cleanup(func() { _ = store.Close() })
			_, err = relay.New(store, tr, relay.Config{LeaseDuration: tc.lease, LeaseRenewInterval: tc.renew, Logger: slog.New(slog.DiscardHandler)})
			if !tc.refused {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			assert.ErrorContains(t, err, "cannot finish inside a lease")
			assert.ErrorContains(t, err, tc.publishTimeout.String())
		})
	}
}
