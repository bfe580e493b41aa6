package chaos_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/chaos"
	"github.com/outboxkit/outbox/store/memory"
)

func memoryHarness() outboxtest.StoreHarness {
	return outboxtest.StoreHarness{
		New: func(t *testing.T, bucketCount int) outbox.DispatchStore {
			s, err := memory.New(memory.Config{BucketCount: bucketCount})
			require.NoError(t, err)
			return s
		},
		Transact: func(ctx context.Context, s outbox.DispatchStore, fn func(ctx context.Context) error) error {
			return s.(*memory.Store).Transact(ctx, fn)
		},
	}
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
	h := memoryHarness()
	inner := h.Transact
	n := 0
	h.Transact = func(ctx context.Context, s outbox.DispatchStore, fn func(ctx context.Context) error) error {
		return inner(ctx, s, func(ctx context.Context) error {
			if err := fn(ctx); err != nil {
				return err
			}
			if n++; n%7 == 0 {
				outbox.ScopeFrom(ctx).Take() // lose this unit's messages
			}
			return nil
		})
	}
	rep, err := chaos.Execute(t, h, chaos.Config{Messages: 300, Writers: 1, Faults: chaos.Schedule{None: true, Duration: 500 * time.Millisecond}, DrainTimeout: time.Second})
	require.NoError(t, err)
	require.Error(t, rep.Err(), "a run that lost messages must fail")
	require.Positive(t, rep.Missing)
	require.Zero(t, rep.Unexpected)
}

// TestCheckerCatchesRolledBackDeliveries: a unit of work that reports a rollback but
// commits anyway must fail the run.
func TestCheckerCatchesRolledBackDeliveries(t *testing.T) {
	h := memoryHarness()
	inner := h.Transact
	h.Transact = func(ctx context.Context, s outbox.DispatchStore, fn func(ctx context.Context) error) error {
		var fnErr error
		err := inner(ctx, s, func(ctx context.Context) error {
			fnErr = fn(ctx)
			return nil // commit whatever happened
		})
		if err != nil {
			return err
		}
		return fnErr
	}
	rep, err := chaos.Execute(t, h, chaos.Config{Messages: 300, Writers: 1, RollbackShare: 0.3, Faults: chaos.Schedule{None: true, Duration: 500 * time.Millisecond}, DrainTimeout: time.Second})
	require.NoError(t, err)
	require.Error(t, rep.Err())
	require.Positive(t, rep.Unexpected)
	require.Zero(t, rep.Missing)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := chaos.Execute(t, memoryHarness(), chaos.Config{Relays: 2, Faults: chaos.Schedule{Crashes: 2}})
	require.ErrorContains(t, err, "Config.Faults.Crashes")
	_, err = chaos.Execute(t, memoryHarness(), chaos.Config{Keys: 2, Writers: 3})
	require.ErrorContains(t, err, "Config.Writers")
}
