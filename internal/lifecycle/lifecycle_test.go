package lifecycle

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// worker is a fn that runs until asked to stop, then does its "final" work on
// Run.Final, and records what it saw.
type worker struct {
	runs, finals, killedFinals atomic.Int32
	running                    atomic.Int32
}

func (w *worker) fn(r Run) error {
	w.runs.Add(1)
	w.running.Add(1)
	defer w.running.Add(-1)
	select {
	case <-r.Stopping():
	case <-r.Work.Done():
	}
	// The final step: short, and cut short by Kill only.
	t := time.NewTimer(time.Duration(rand.IntN(200)) * time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
		w.finals.Add(1)
	case <-r.Final.Done():
		w.killedFinals.Add(1)
	}
	return nil
}

func TestStartStopKillStress(t *testing.T) {
	before := runtime.NumGoroutine()
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	for range rounds {
		s := New()
		w := &worker{}
		var wg sync.WaitGroup
		var startedOK atomic.Int32
		for range 8 {
			wg.Go(func() {
				for range 4 {
					switch rand.IntN(5) {
					case 0, 1:
						err := s.Start(context.Background(), nil, w.fn)
						switch {
						case err == nil:
							startedOK.Add(1)
						case errors.Is(err, ErrRunning), errors.Is(err, ErrEnded):
						default:
							t.Errorf("Start: unexpected error %v", err)
						}
					case 2:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(100))*time.Microsecond)
						err := s.Stop(ctx)
						cancel()
						if err != nil && !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("Stop: unexpected error %v", err)
						}
					case 3:
						s.Kill()
						if s.Running() {
							t.Errorf("Kill returned while fn runs")
						}
					case 4:
						_ = s.Err()
						_ = s.Running()
					}
				}
			})
		}
		wg.Wait()
		s.Kill()
		require.LessOrEqual(t, startedOK.Load(), int32(1), "a service starts at most once")
		require.Equal(t, startedOK.Load(), w.runs.Load(), "fn runs once per successful Start")
		require.Zero(t, w.running.Load(), "fn has returned after Kill")
		require.Equal(t, w.runs.Load(), w.finals.Load()+w.killedFinals.Load(), "every run reached its final step")
		require.ErrorIs(t, s.Start(context.Background(), nil, w.fn), ErrEnded, "a killed service never starts again")
		require.NoError(t, s.Stop(context.Background()))
	}
	// Every goroutine a Service started has ended (allow the runtime a moment to
	// reap them on a busy machine).
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	require.LessOrEqual(t, runtime.NumGoroutine(), before, "no goroutine outlives its service")
}

func TestStopLetsTheFinalStepRunAfterWorkIsCancelled(t *testing.T) {
	s := New()
	finalRan := make(chan error, 1)
	require.NoError(t, s.Start(context.Background(), nil, func(r Run) error {
		<-r.Work.Done() // ignores the stop request: only a cancelled Work ends it
		finalRan <- r.Final.Err()
		return errors.New("worked")
	}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Stop(ctx), context.Canceled)
	require.NoError(t, <-finalRan, "Final lives on after a Stop whose context ended")
	require.EqualError(t, s.Err(), "worked")
	require.False(t, s.Running())
	require.ErrorIs(t, s.Start(context.Background(), nil, nil), ErrEnded)
}

func TestKillCancelsFinal(t *testing.T) {
	s := New()
	finalErr := make(chan error, 1)
	require.NoError(t, s.Start(context.Background(), nil, func(r Run) error {
		<-r.Stopping()
		<-r.Final.Done()
		finalErr <- r.Final.Err()
		return nil
	}))
	s.Kill()
	require.ErrorIs(t, <-finalErr, context.Canceled)
	require.True(t, s.Killed())
}

func TestStartContextEndAsksForAStop(t *testing.T) {
	s := New()
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	seen := make(chan any, 1)
	require.NoError(t, s.Start(ctx, nil, func(r Run) error {
		seen <- r.Work.Value(ctxKey{})
		<-r.Stopping()
		return nil
	}))
	require.Equal(t, "v", <-seen, "Start's values reach fn")
	cancel()
	<-s.Done()
	require.NoError(t, s.Err())
}

type ctxKey struct{}

func TestRefusedCheckLeavesTheServiceStartable(t *testing.T) {
	s := New()
	refuse := errors.New("not ready")
	require.ErrorIs(t, s.Start(context.Background(), func() error { return refuse }, nil), refuse)
	require.False(t, s.Started())
	require.NoError(t, s.Stop(context.Background()), "Stop on a service that never started")
	ran := make(chan struct{})
	require.NoError(t, s.Start(context.Background(), func() error { return nil }, func(r Run) error {
		close(ran)
		<-r.Stopping()
		return nil
	}))
	<-ran
	require.ErrorIs(t, s.Start(context.Background(), nil, nil), ErrRunning)
	require.NoError(t, s.Stop(context.Background()))
	require.ErrorIs(t, s.Start(context.Background(), nil, nil), ErrEnded)
}

func TestStartOnEndedContext(t *testing.T) {
	s := New()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.Start(ctx, nil, nil), context.Canceled)
	require.False(t, s.Started())
}

func TestKillBeforeStart(t *testing.T) {
	s := New()
	s.Kill()
	require.ErrorIs(t, s.Start(context.Background(), nil, nil), ErrEnded)
	require.False(t, s.Running())
}

func TestRunSleep(t *testing.T) {
	s := New()
	slept := make(chan bool, 2)
	require.NoError(t, s.Start(context.Background(), nil, func(r Run) error {
		slept <- r.Sleep(time.Microsecond)
		slept <- r.Sleep(time.Hour)
		return nil
	}))
	require.True(t, <-slept, "a short sleep ends on its timer")
	require.NoError(t, s.Stop(context.Background()))
	require.False(t, <-slept, "a stop ends a sleep")
}
