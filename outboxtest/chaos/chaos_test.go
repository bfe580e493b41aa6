package chaos_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/chaos"
	"github.com/outboxkit/outbox/store/memstore"
)

// memoryHarness leaves Transact nil: the run uses the store's own.
func memoryHarness() outboxtest.StoreHarness {
	return outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outboxtest.Store {
			s, err := memstore.New(memstore.Config{BucketCount: bucketCount})
			require.NoError(t, err)
			return s
		},
	}
}

// wrapTransact returns a harness whose units of work run through wrap around the
// store's own Transact.
func wrapTransact(wrap func(ctx context.Context, s outboxtest.Store, fn func(ctx context.Context) error) error) outboxtest.StoreHarness {
	h := memoryHarness()
	h.Transact = wrap
	return h
}

func TestRunOnMemoryStore(t *testing.T) {
	rep := chaos.Run(t, memoryHarness(), chaos.Config{Messages: 1500, Faults: chaos.Schedule{Duration: 3 * time.Second}})
	require.Equal(t, 1500, rep.Committed+rep.RolledBack)
	require.Positive(t, rep.RolledBack, "some units must be rolled back on purpose")
	require.Positive(t, rep.InjectedErrors, "faults must have been injected")
	require.Equal(t, 1, rep.Crashes)
	require.Equal(t, 1, rep.GracefulStops)
	require.GreaterOrEqual(t, rep.Deliveries, rep.Committed)
}

func TestRunWithoutFaults(t *testing.T) {
	rep := chaos.Run(t, memoryHarness(), chaos.Config{Messages: 500, Faults: chaos.Schedule{Duration: time.Second, None: true}})
	require.Zero(t, rep.InjectedErrors)
	require.Zero(t, rep.Crashes)
	require.Zero(t, rep.Duplicates, "with no faults nothing is published twice")
}

// TestCheckerCatchesLoss proves the checker is not blind: a store that silently drops
// a share of what it is asked to write must fail the run.
func TestCheckerCatchesLoss(t *testing.T) {
	errLost := errors.New("lost on purpose")
	n := 0
	h := wrapTransact(func(ctx context.Context, s outboxtest.Store, fn func(ctx context.Context) error) error {
		return s.Transact(ctx, func(ctx context.Context) error {
			if n++; n%7 != 0 {
				return fn(ctx)
			}
			// Lose this unit's staged messages: run it as a savepoint that is rolled
			// back, and report success; the unit commits nothing.
			err := s.Transact(ctx, func(ctx context.Context) error {
				if err := fn(ctx); err != nil {
					return err
				}
				return errLost
			})
			if errors.Is(err, errLost) {
				return nil
			}
			return err
		})
	})
	rep, err := chaos.Execute(t, h, chaos.Config{Messages: 300, Writers: 1, Faults: chaos.Schedule{None: true, Duration: 500 * time.Millisecond}, DrainTimeout: time.Second})
	require.NoError(t, err)
	require.Error(t, rep.Err(), "a run that lost messages must fail")
	require.Positive(t, rep.Missing)
	require.Zero(t, rep.Unexpected)
}

// TestCheckerCatchesRolledBackDeliveries: a unit of work that reports a rollback but
// commits anyway must fail the run.
func TestCheckerCatchesRolledBackDeliveries(t *testing.T) {
	h := wrapTransact(func(ctx context.Context, s outboxtest.Store, fn func(ctx context.Context) error) error {
		var fnErr error
		err := s.Transact(ctx, func(ctx context.Context) error {
			fnErr = fn(ctx)
			return nil // commit whatever happened
		})
		if err != nil {
			return err
		}
		return fnErr
	})
	rep, err := chaos.Execute(t, h, chaos.Config{Messages: 300, Writers: 1, RollbackShare: 0.3, Faults: chaos.Schedule{None: true, Duration: 500 * time.Millisecond}, DrainTimeout: time.Second})
	require.NoError(t, err)
	require.Error(t, rep.Err())
	require.Positive(t, rep.Unexpected)
	require.Zero(t, rep.Missing)
}

// A harness's Transact, when set, is what the writers use.
func TestHarnessTransactIsUsed(t *testing.T) {
	var units atomic.Int64
	h := wrapTransact(func(ctx context.Context, s outboxtest.Store, fn func(ctx context.Context) error) error {
		units.Add(1)
		return s.Transact(ctx, fn)
	})
	rep := chaos.Run(t, h, chaos.Config{Messages: 100, Writers: 1, UnitSize: 1, RollbackShare: -1, Faults: chaos.Schedule{None: true, Duration: 200 * time.Millisecond}})
	require.Equal(t, 100, rep.Committed)
	require.Equal(t, int64(100), units.Load(), "one unit of work per message, all through the harness")
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := chaos.Execute(t, memoryHarness(), chaos.Config{Relays: 2, Faults: chaos.Schedule{Crashes: 2}})
	require.ErrorContains(t, err, "Config.Faults.Crashes")
	_, err = chaos.Execute(t, memoryHarness(), chaos.Config{Keys: 2, Writers: 3})
	require.ErrorContains(t, err, "Config.Writers")
	_, err = chaos.Execute(t, outboxtest.StoreHarness{}, chaos.Config{})
	require.ErrorContains(t, err, "StoreHarness.New")
}
