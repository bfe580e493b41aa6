package relay

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// runConfig is a real-clock relay that notices a store fault within a poll.
func runConfig() Config {
	return Config{
		RelayID:            "run",
		PollInterval:       20 * time.Millisecond,
		LeaseDuration:      3 * time.Second,
		LeaseRenewInterval: time.Second,
		Logger:             quietLogger(),
	}
}

// Run returns the error that stopped the worker, so a program waiting on it learns
// that its relay is dead instead of taking writes nobody relays.
func TestRunReturnsTheErrorThatStoppedTheWorker(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	r, err := New(store, outboxtest.NewRecorder(), runConfig())
	require.NoError(t, err)

	done := make(chan error, 1)
	go func() { done <- r.Run(t.Context()) }()
	require.Eventually(t, r.Ready, time.Minute, 10*time.Millisecond, "the relay takes its buckets")
	require.NoError(t, store.Close()) // every store call now fails with ErrClosed

	select {
	case err := <-done:
		require.ErrorIs(t, err, outbox.ErrClosed)
		require.Equal(t, r.Err(), err, "Run returns what Err reports")
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its store closed")
	}
}

// Run returns nil once its ctx ends, after handing its leases back.
func TestRunStopsGracefullyWhenItsContextEnds(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	r, err := New(store, outboxtest.NewRecorder(), runConfig())
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, r.Ready, time.Minute, 10*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after its ctx ended")
	}
	view, err := store.Driver().ReadCoordination(context.Background())
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "bucket %d was handed back", l.Bucket)
	}
}

// Start checks the store first: a store that cannot be relayed from fails Start (and
// Run) at once, and starts nothing.
func TestStartChecksTheStore(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	require.NoError(t, store.Close())
	r, err := New(store, outboxtest.NewRecorder(), runConfig())
	require.NoError(t, err)
	err = r.Start(t.Context())
	require.ErrorIs(t, err, outbox.ErrClosed)
	require.False(t, errors.Is(err, ErrRunning))
	require.ErrorIs(t, r.Run(t.Context()), outbox.ErrClosed, "a refused Start may be tried again, and fails again")
	require.NoError(t, r.Stop(t.Context()), "Stop on a relay that never started does nothing")
}

// pinging is a transport that answers Ping, as the broker transports do.
type pinging struct{ *outboxtest.Recorder }

func (pinging) Ping(context.Context) error { return nil }

// A transport without Ping (a wrapper that forgot to forward it, say) turns
// broker-loss failover off; New says so at WARN, naming the fix.
func TestNewWarnsWhenTheTransportCannotBePinged(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	var sink logSink
	cfg := runConfig()
	cfg.Logger = sink.Logger()
	_, err = New(store, outboxtest.NewRecorder(), cfg)
	require.NoError(t, err)
	warned := sink.Records("cannot be pinged")
	require.Len(t, warned, 1)
	require.Equal(t, slog.LevelWarn, warned[0].Level)
	require.Contains(t, warned[0].Msg, "driver.Pinger")

	var quiet logSink
	cfg.Logger = quiet.Logger()
	_, err = New(store, pinging{outboxtest.NewRecorder()}, cfg)
	require.NoError(t, err)
	require.Empty(t, quiet.Records("cannot be pinged"))
}
