package relay

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// DefaultBacklogInterval is how often the relay holding bucket 0 samples the backlog.
const DefaultBacklogInterval = 30 * time.Second

// backlogSource samples the backlog: the store's [driver.BacklogSampler] if it has
// one, else its [driver.Admin] Stats.
type backlogSource func(ctx context.Context) (driver.Backlog, bool, error)

func newBacklogSource(store driver.Store) backlogSource {
	if s, ok := store.(driver.BacklogSampler); ok {
		return s.SampleBacklog
	}
	if a, ok := store.(driver.Admin); ok {
		return func(ctx context.Context) (driver.Backlog, bool, error) {
			st, err := a.Stats(ctx)
			return st, err == nil, err
		}
	}
	return nil
}

// backlogSampler samples the backlog every BacklogInterval while this relay may
// publish bucket 0. Only one relay of a fleet holds bucket 0, so the sample's cost
// does not grow with the fleet. A failed sample is logged at DEBUG and tried again at
// the next interval; it never fails a round.
type backlogSampler struct {
	cfg    *Config
	log    *slog.Logger
	source backlogSource // nil: the store cannot say
	leases *leaseTable
	meter  *meter

	mu     sync.Mutex
	sample driver.Backlog
	at     time.Time // when sample was taken; zero: never
	tried  time.Time // when the last sample was attempted, successful or not

	// inFlight runs at most one sample at a time (busy); the worker waits for it
	// before it stops.
	inFlight sync.WaitGroup
	busy     atomic.Bool
}

// off reports that no sample is ever taken.
func (s *backlogSampler) off() bool { return s.source == nil || s.cfg.BacklogInterval < 0 }

// take samples the backlog if this relay may publish bucket 0 and the last attempt is
// at least BacklogInterval old.
func (s *backlogSampler) take(ctx context.Context) {
	if s.off() {
		return
	}
	now := s.cfg.now()
	s.mu.Lock()
	due := s.tried.IsZero() || now.Sub(s.tried) >= s.cfg.BacklogInterval || now.Before(s.tried)
	s.mu.Unlock()
	if !due || !s.leases.publishable(0, now) {
		return
	}
	s.mu.Lock()
	s.tried = now
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.LeaseRenewInterval)
	st, ok, err := s.source(cctx)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Debug("relay: sampling the backlog failed; trying again later", "error", err)
		}
		return
	}
	if !ok {
		return
	}
	at := s.cfg.now()
	s.mu.Lock()
	s.sample, s.at = st, at
	s.mu.Unlock()
	s.meter.obs.Backlog(ctx, st, at)
}

// start samples in the background, if no sample is in flight, so a slow sample never
// delays the next round.
func (s *backlogSampler) start(ctx context.Context) {
	if s.off() || !s.busy.CompareAndSwap(false, true) {
		return
	}
	s.inFlight.Go(func() {
		defer s.busy.Store(false)
		s.take(ctx)
	})
}

// wait waits for a sample in flight.
func (s *backlogSampler) wait() { s.inFlight.Wait() }

// last returns the last sample and when it was taken (zero: none).
func (s *backlogSampler) last() (driver.Backlog, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.sample
	st.Pending = slices.Clone(st.Pending) // the caller's to keep
	return st, s.at
}
