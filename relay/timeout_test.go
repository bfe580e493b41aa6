package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
)

// slowAcks is a transport that may wait up to wait for the broker.
type slowAcks struct {
	*outboxtest.Recorder
	wait time.Duration
}

func (s slowAcks) PublishTimeout() time.Duration { return s.wait }

// A transport whose publish may wait longer than a lease can cover is refused at New:
// its publishes would be abandoned over and over.
func TestNewRefusesAPublishTimeoutLongerThanALease(t *testing.T) {
	store := newStore(t, 2)
	cfg := Config{LeaseDuration: 12 * time.Second, LeaseRenewInterval: 4 * time.Second, Logger: quietLogger()}
	_, err := New(store, slowAcks{outboxtest.NewRecorder(), 10 * time.Second}, cfg)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "cannot finish inside a lease")
	require.ErrorContains(t, err, "10s")
	_, err = New(store, slowAcks{outboxtest.NewRecorder(), 7 * time.Second}, cfg)
	require.NoError(t, err, "7 s fits in 12 s − 4 s")
}
