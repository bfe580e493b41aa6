package relay

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// cuttable is a broker the test can cut off: publishes fail (transient) and pings fail.
type cuttable struct {
	*outboxtest.Recorder
	cut atomic.Bool
}

var errUnreachable = errors.New("broker unreachable")

func (c *cuttable) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if c.cut.Load() {
		return errUnreachable
	}
	return c.Recorder.Publish(ctx, batch)
}

func (c *cuttable) Ping(context.Context) error {
	if c.cut.Load() {
		return errUnreachable
	}
	return nil
}

// Readiness follows the broker: a relay whose publishes keep failing while its broker
// does not answer a ping is not ready, before it steps aside, and is ready again once
// the broker answers.
func TestReadyReflectsTheBroker(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, 4)
	tr := &cuttable{Recorder: outboxtest.NewRecorder()}
	cfg := workerConfig("r")
	cfg.LeaseDuration = time.Minute // no step-aside within the test: readiness alone
	cfg.LeaseRenewInterval = 200 * time.Millisecond
	d := newDispatcher(t, store, tr, cfg)
	require.NoError(t, d.Start(ctx))
	t.Cleanup(d.Kill)
	waitFor(t, "ready", d.Ready)

	tr.cut.Store(true)
	enqueue(t, store, nil, 8) // publishes now fail: a failure streak starts
	waitFor(t, "not ready while the broker is cut off", func() bool { return !d.Ready() })
	require.Len(t, d.Owned(), 4, "the relay still holds its buckets: it has not stepped aside")

	tr.cut.Store(false)
	waitFor(t, "ready again once the broker answers", d.Ready)
	wait, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, tr.WaitForUnique(wait, 8))
}

// A ping that answered during an earlier, healed streak of failures says nothing
// about a new one: the first envelope to run out of attempts in a new outage must
// see the broker as cut off (and be rescheduled), not be parked on the cached
// success.
func TestNewOutageIsNotJudgedByAnEarlierPing(t *testing.T) {
	ctx := context.Background()
	tr := &cuttable{Recorder: outboxtest.NewRecorder()}
	h := &brokerHealth{pinger: tr, cache: time.Hour, timeout: time.Second}
	t0 := time.Now()

	// A publish fails (a slow call, say) while the broker answers: the ping ends
	// the streak and its success is cached.
	h.published(t0, t0.Add(time.Millisecond), 0, true)
	require.False(t, h.cutOff(ctx, t0.Add(time.Second), 0), "the broker answers")

	// Then the broker is cut off, well within the cache interval.
	tr.cut.Store(true)
	h.published(t0.Add(2*time.Second), t0.Add(3*time.Second), 0, true)
	require.True(t, h.cutOff(ctx, t0.Add(3*time.Second), 0), "a new streak asks the broker again")
	require.True(t, h.unreachable())
}
