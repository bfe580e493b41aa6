package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// newInstance identifies this process for the relay records: the host name (cut to
// what stores keep), the process ID and a fresh random nonce, so every relay built is
// an instance of its own, even a restart that reuses a PID.
func newInstance() (driver.Instance, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	if len(host) > driver.MaxInstanceHost {
		host = host[:driver.MaxInstanceHost]
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return driver.Instance{}, fmt.Errorf("relay: instance nonce: %w", err)
	}
	return driver.Instance{Host: host, PID: os.Getpid(), Nonce: hex.EncodeToString(nonce[:])}, nil
}

// clashWatch notices another live process writing this relay's record: two processes
// configured with one relay ID. Each heartbeat carries its writer's instance, so while
// both run each sees the other's heartbeats in its reads of the relay records.
type clashWatch struct {
	self driver.Instance

	mu sync.Mutex
	// since is when this instance started its current run (Start, or a RunOnce
	// sweep): a record dated no later was left by a predecessor (a relay that stopped
	// or crashed before this one started under its ID), not written by a live peer.
	since time.Time
	// last is the other instance's heartbeat counted last, so a record read again
	// is not counted twice; logged is when the last ERROR went out.
	last   driver.RelayRecord
	logged time.Time
}

// started records the start of a run at now.
func (w *clashWatch) started(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.since = now
}

// checkInstance looks for this relay's own record in relays (a coordination read or
// a read of the relay records at now) and reports it when another live instance wrote
// it: a heartbeat less than LeaseDuration old, not stopped, dated after this run
// started, from an instance that is not this one. Each such heartbeat counts once
// ([Stats.InstanceClashes] and [Observer.InstanceClash]); the ERROR naming both
// instances goes out at most once per LeaseRenewInterval.
func (c *coordinator) checkInstance(ctx context.Context, relays []driver.RelayRecord, now time.Time) {
	w := c.clash
	for _, r := range relays {
		if r.ID != c.cfg.RelayID {
			continue
		}
		if r.Instance.IsZero() || r.Instance == w.self || r.Stopped() || now.Sub(r.LastSeen) >= c.cfg.LeaseDuration {
			return
		}
		w.mu.Lock()
		if !r.LastSeen.After(w.since) || (r.Instance == w.last.Instance && r.LastSeen.Equal(w.last.LastSeen)) {
			w.mu.Unlock()
			return
		}
		w.last = r
		logNow := w.logged.IsZero() || now.Sub(w.logged) >= c.cfg.LeaseRenewInterval || now.Before(w.logged)
		if logNow {
			w.logged = now
		}
		w.mu.Unlock()
		c.meter.instanceClash(ctx, w.self, r.Instance)
		if logNow {
			c.log.Error("relay: another live process runs under this relay's ID: both claim and publish the same buckets (duplicate publishes, refused lease writes); give each process its own relay ID (relay.Config.RelayID, outbox-relay -relay-id), or stop one of them",
				"this_instance", w.self.String(), "other_instance", r.Instance.String(), "other_heartbeat", r.LastSeen)
		}
		return
	}
}
