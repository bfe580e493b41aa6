package relay

import (
	"context"
	"sync"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// brokerHealth tracks whether this relay can reach its broker, for transports that
// implement [driver.Pinger]. Without one the relay cannot tell a broker it cannot
// reach from messages the broker refuses, and tracks nothing.
//
// A publish call that the broker acknowledged nothing of, with no permanent failure,
// is a transport-level failure, and a streak of them starts when its first call began;
// an acknowledgement ends the streak. Once a streak has
// lasted a LeaseDuration and a ping fails too, the relay steps aside: it stamps itself
// stopped and hands its buckets back, so peers that reach the broker publish them
// within a second or so; it pings every PollInterval and rejoins the fleet once the
// broker answers. During a streak that a ping confirms, an envelope that reaches
// MaxAttempts is rescheduled, not parked: a relay cut off from its broker parks
// nothing that a peer could deliver.
type brokerHealth struct {
	pinger driver.Pinger
	// cache bounds pings to one per cache interval; timeout bounds one ping.
	cache, timeout time.Duration

	mu       sync.Mutex
	since    time.Time // start of the streak of transport-level failures; zero: none
	ackedAt  time.Time // when the last acknowledged call ended
	pingedAt time.Time // when the last ping answered (real clock)
	pingErr  error     // its outcome
}

// published records the outcome of a publish call that began and ended at the given
// times. A failure streak starts when its first failing call began (a black-holed
// broker holds that call for most of a lease), but never before the last
// acknowledgement.
func (h *brokerHealth) published(began, ended time.Time, acked int, transportFailure bool) {
	if h.pinger == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case acked > 0:
		h.since = time.Time{}
		h.ackedAt = ended
	case transportFailure && h.since.IsZero():
		h.since = began
		if began.Before(h.ackedAt) {
			h.since = h.ackedAt
		}
		// A ping that answered before this streak says nothing about it: without
		// this, a cached success from an earlier, healed streak would let the
		// first envelope to run out of attempts in a new outage be parked.
		if h.pingErr == nil {
			h.pingedAt = time.Time{}
		}
	}
}

// cutOff reports whether the streak has lasted at least minAge at now and the broker
// does not answer a ping.
func (h *brokerHealth) cutOff(ctx context.Context, now time.Time, minAge time.Duration) bool {
	if h.pinger == nil {
		return false
	}
	h.mu.Lock()
	since := h.since
	h.mu.Unlock()
	if since.IsZero() || now.Sub(since) < minAge {
		return false
	}
	return h.ping(ctx) != nil
}

// ping asks the broker, at most once per cache interval; a success ends the streak.
func (h *brokerHealth) ping(ctx context.Context) error {
	h.mu.Lock()
	if !h.pingedAt.IsZero() && time.Since(h.pingedAt) < h.cache {
		err := h.pingErr
		h.mu.Unlock()
		return err
	}
	h.mu.Unlock()
	pctx, cancel := context.WithTimeout(ctx, h.timeout)
	err := h.pinger.Ping(pctx)
	cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pingedAt, h.pingErr = time.Now(), err
	if err == nil {
		h.since = time.Time{}
	}
	return err
}

// unreachable reports whether the broker is down as far as this relay can tell: a
// failure streak is running and the last ping failed. It never pings, so a readiness
// probe can ask it freely.
func (h *brokerHealth) unreachable() bool {
	if h.pinger == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.since.IsZero() && h.pingErr != nil
}
