package relay

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// countingReads counts a relay's reads of the relay records (the watch).
type countingReads struct {
	memDriver
	reads *atomic.Int64
}

func (c countingReads) Driver() driver.Store { return c }

func (c countingReads) ReadRelays(ctx context.Context) ([]driver.RelayRecord, error) {
	c.reads.Add(1)
	return c.memDriver.ReadRelays(ctx)
}

// A standby so far back in line that no peer's stop can reach it before its next
// round makes no watch reads between rounds; a standby next in line keeps watching.
func TestFarStandbyDoesNotWatch(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, 1)
	cfg := func(id string) Config {
		c := workerConfig(id)
		c.LeaseDuration, c.LeaseRenewInterval = 3*time.Second, 300*time.Millisecond
		return c
	}
	reads := map[string]*atomic.Int64{}
	var relays []*Relay
	for _, id := range []string{"a", "b", "c"} {
		reads[id] = new(atomic.Int64)
		d := newDispatcher(t, countingReads{relaySide(store), reads[id]}, outboxtest.NewRecorder(), cfg(id))
		require.NoError(t, d.Start(ctx))
		t.Cleanup(d.Kill)
		relays = append(relays, d)
	}
	rank := func(d *Relay) int {
		d.coord.mu.Lock()
		defer d.coord.mu.Unlock()
		return d.coord.lastPlan.StandbyRank
	}
	var next, far *Relay
	waitFor(t, "the fleet settles: a holder, a standby next in line, one behind it", func() bool {
		owned := 0
		next, far = nil, nil
		for _, d := range relays {
			if !d.Ready() {
				return false
			}
			owned += len(d.Owned())
			switch rank(d) {
			case 0:
				next = d
			case 1:
				far = d
			}
		}
		return owned == 1 && next != nil && far != nil
	})
	// Let a round run on the settled view, so the far standby knows it is far.
	time.Sleep(2 * cfg("x").LeaseRenewInterval)
	require.Equal(t, 1, rank(far))
	reads[next.RelayID()].Store(0)
	reads[far.RelayID()].Store(0)
	time.Sleep(time.Second) // many watch intervals (10 ms at these timings)
	require.Positive(t, reads[next.RelayID()].Load(), "the standby next in line watches")
	require.Zero(t, reads[far.RelayID()].Load(), "the standby far back in line does not")
}
