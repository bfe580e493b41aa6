package relay

import (
	"math/rand/v2"
	"time"
)

// The timings every service of the relay derives from one Config.

// now reads the clock, in UTC, truncated to the microsecond precision stores keep.
func (c *Config) now() time.Time {
	return c.Now().UTC().Truncate(time.Microsecond)
}

// margin is how long before its expiry a lease stops covering publishes: a batch that
// starts later could still be in flight when a peer takes the bucket.
func (c *Config) margin() time.Duration { return c.LeaseRenewInterval / 2 }

// releaseTimeout bounds handing the leases back once the context of the call that
// stops the relay has ended: see releaseBound.
const releaseTimeout = 5 * time.Second

// releaseBound is how long the relay keeps trying to stamp itself stopped and hand its
// leases back after the caller's context ended (or without one, when the worker stops
// on its own): min(LeaseDuration, 5 s). Beyond LeaseDuration the leases lapse anyway.
func (c *Config) releaseBound() time.Duration {
	return min(c.LeaseDuration, releaseTimeout)
}

// Timings of the coordination loop:
//
//   - watchInterval: between rounds the relay reads the relay records (one small
//     read) this often, and runs a round at once when a peer joined, stopped, lapsed
//     or changed its bucket count: half of PollInterval (at most half of
//     LeaseRenewInterval), 500 ms by default.
//   - settleInterval: while the fleet moves buckets (the plan is unsettled) rounds
//     follow each other this often: half the watch interval, 250 ms by default.
//   - lapseGrace: a round is run this long after the next time the plan can change
//     by time alone (a peer's lease or heartbeat lapses): 1 % of LeaseDuration, at
//     most 250 ms.
func (c *Config) watchInterval() time.Duration {
	return max(min(c.PollInterval, c.LeaseRenewInterval)/2, time.Millisecond)
}

func (c *Config) settleInterval() time.Duration {
	return max(c.watchInterval()/2, time.Millisecond)
}

func (c *Config) lapseGrace() time.Duration {
	return min(c.LeaseDuration/100, 250*time.Millisecond)
}

// errorDelay is the next pause after a failure that followed a pause of last: from
// 50 ms, doubling, up to LeaseRenewInterval, so a store outage never turns a loop
// tight.
func (c *Config) errorDelay(last time.Duration) time.Duration {
	return min(max(2*last, 50*time.Millisecond), c.LeaseRenewInterval)
}

// backoff is the delay after the given number of failed attempts: BackoffBase doubled
// per further failure, capped at BackoffMax, minus a random share of up to Jitter.
func (c *Config) backoff(attempts int) time.Duration {
	delay := c.BackoffBase
	for i := 1; i < attempts && delay < c.BackoffMax; i++ {
		delay *= 2
	}
	delay = min(delay, c.BackoffMax)
	if c.Jitter > 0 {
		delay -= time.Duration(rand.Float64() * c.Jitter * float64(delay))
	}
	return delay
}

// warnLimit rate-limits a repeated warning to one WARN per LeaseRenewInterval; the
// records between two warnings go to DEBUG, and the next warning says how many.
type warnLimit struct {
	last       time.Time // when the last warning was logged; zero: never
	suppressed int       // records logged at DEBUG since then
}

// next reports whether the record due at now is a warning (the first, one a full
// interval after the last, or one after the clock went back) and, if so, how many
// records went to DEBUG since the previous warning.
func (w *warnLimit) next(now time.Time, interval time.Duration) (warn bool, suppressed int) {
	if !w.last.IsZero() && now.Sub(w.last) < interval && !now.Before(w.last) {
		w.suppressed++
		return false, 0
	}
	suppressed = w.suppressed
	w.last, w.suppressed = now, 0
	return true, suppressed
}
