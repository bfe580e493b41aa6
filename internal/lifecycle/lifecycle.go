// Package lifecycle is the one start/stop primitive every long-running part of the
// relay is built on: a Service runs one function in a goroutine, once, and offers the
// three ways out that a relay needs.
//
//   - Stop asks the function to end (it sees [Run.Stopping]) and waits; if the caller's
//     context ends first, the function's work context is cancelled and Stop waits
//     for the function to return.
//   - Kill cancels both of the function's contexts at once, as a crash would, and
//     waits.
//   - The function may end on its own, with an error that [Service.Err] keeps.
//
// A Service starts once: Start while it runs returns [ErrRunning], and after it ended
// (or was killed) [ErrEnded]. Every method is safe for concurrent use, in any order,
// any number of times.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"time"
)

var (
	// ErrRunning is returned by Start while the function runs.
	ErrRunning = errors.New("lifecycle: already running")
	// ErrEnded is returned by Start once the function ended or the service was killed.
	ErrEnded = errors.New("lifecycle: ended")
)

// Run is what the function of a Service receives.
type Run struct {
	// Work ends when a Stop's context ends before the function returned, or on Kill:
	// the function's ongoing work should stop.
	Work context.Context
	// Final ends on Kill only: the function may use it for what it does on its way
	// out (handing back what it holds), which a Stop whose context ended still wants
	// done.
	Final context.Context
	stop  <-chan struct{}
}

// Stopping is closed once a stop was asked for: by Stop, Kill, or the end of Start's
// context.
func (r Run) Stopping() <-chan struct{} { return r.stop }

// Stopped reports whether a stop was asked for or Work has ended.
func (r Run) Stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
		return r.Work.Err() != nil
	}
}

// Sleep waits for d, a stop or the end of Work; it reports false on the latter two.
func (r Run) Sleep(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-r.stop:
		return false
	case <-r.Work.Done():
		return false
	case <-timer.C:
		return true
	}
}

// Service runs one function once. The zero value is not usable: build one with New.
type Service struct {
	mu      sync.Mutex
	started bool
	killed  bool
	// cancelWork ends Run.Work, kill ends Run.Final (and with it Run.Work).
	cancelWork, kill context.CancelFunc
	err              error

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// New returns a service that has not started.
func New() *Service {
	return &Service{stop: make(chan struct{}), done: make(chan struct{})}
}

// Start runs fn in a goroutine and returns once it runs. check, if not nil, runs first
// under the service's lock, so no second Start can slip past it: if it fails, Start
// returns its error and starts nothing, and a later Start may try again.
//
// ctx's values reach fn's contexts; its end asks fn to stop, as Stop would. fn's
// error is kept for Err.
func (s *Service) Start(ctx context.Context, check func() error, fn func(Run) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.killed {
		select {
		case <-s.done:
		default:
			if s.started {
				return ErrRunning
			}
		}
		return ErrEnded
	}
	if check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	s.started = true
	final, kill := context.WithCancel(context.WithoutCancel(ctx))
	work, cancelWork := context.WithCancel(final)
	s.cancelWork, s.kill = cancelWork, kill
	unwatch := context.AfterFunc(ctx, s.requestStop)
	go func() {
		defer close(s.done)
		defer kill()
		defer unwatch()
		defer cancelWork()
		err := fn(Run{Work: work, Final: final, stop: s.stop})
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
	}()
	return nil
}

// Stop asks fn to stop and waits until it returned. If ctx ends first, it cancels
// fn's work context, still waits for fn, and returns ctx's error. On a service that
// never started it does nothing.
func (s *Service) Stop(ctx context.Context) error {
	if !s.Started() {
		return nil
	}
	s.requestStop()
	select {
	case <-s.done:
	case <-ctx.Done():
		s.cancelWork()
		<-s.done
	}
	return ctx.Err()
}

// Kill cancels both of fn's contexts and waits until it returned. On a service that
// never started it only keeps it from starting.
func (s *Service) Kill() {
	s.mu.Lock()
	s.killed = true
	started := s.started
	s.mu.Unlock()
	if !started {
		return
	}
	s.requestStop()
	s.kill()
	<-s.done
}

func (s *Service) requestStop() { s.stopOnce.Do(func() { close(s.stop) }) }

// Started reports whether Start ran fn.
func (s *Service) Started() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// Killed reports whether Kill was called.
func (s *Service) Killed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killed
}

// Running reports whether fn was started and has not returned.
func (s *Service) Running() bool {
	if !s.Started() {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Done is closed once fn has returned.
func (s *Service) Done() <-chan struct{} { return s.done }

// Err is the error fn returned; nil while it runs.
func (s *Service) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
