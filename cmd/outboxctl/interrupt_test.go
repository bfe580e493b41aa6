package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// interruptingWriter cancels a context the first time something is written to it,
// as an operator's Ctrl-C during the first progress update would.
type interruptingWriter struct {
	mu     sync.Mutex
	b      strings.Builder
	cancel context.CancelFunc
}

func (w *interruptingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancel != nil {
		w.cancel()
	}
	return w.b.Write(p)
}

func (w *interruptingWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func TestRequeueShowsProgressAndSurvivesAnInterrupt(t *testing.T) {
	ctx := context.Background()
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "outbox.db")
	b := backend{name: "sqlite", args: []string{"-store", dsn}}
	ok(t, b, "migrate")
	st, err := openStore(ctx, storeOptions{DSN: dsn})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	const n = 250
	var envs []*driver.Envelope
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "k%d", i), Payload: []byte("x")}, st.BucketCount())
		require.NoError(t, err)
		envs = append(envs, env)
	}
	require.NoError(t, st.Enqueue(ctx, envs...))
	for bucket := range st.BucketCount() {
		fetched, err := st.Fetch(ctx, bucket, 1000)
		require.NoError(t, err)
		for _, e := range fetched.Envelopes {
			require.NoError(t, st.Park(ctx, e, "broker down"))
		}
	}

	// Interrupted after the first batch: it says what it did and exits 4.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out strings.Builder
	errOut := &interruptingWriter{cancel: cancel}
	code := run(runCtx, append([]string{"requeue"}, append(b.args, "-all")...), &out, errOut)
	require.Equal(t, exitInterrupted, code, "stdout %q stderr %q", out.String(), errOut.String())
	require.Contains(t, out.String(), "requeued 100 of 250")
	require.Contains(t, errOut.String(), "[############..................] 100/250 (100 changed)", "a progress bar")
	require.Contains(t, errOut.String(), "run the same command again to finish")

	stats, err := st.Store.(driver.Admin).Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, 150, stats.Parked, "exactly the first batch was requeued")

	// Run again: it finishes the rest, with a progress bar that ends full.
	var out2, errOut2 strings.Builder
	require.Equal(t, exitOK, run(ctx, append([]string{"requeue"}, append(b.args, "-all")...), &out2, &errOut2))
	require.Contains(t, out2.String(), "requeued 150 of 150")
	require.Contains(t, errOut2.String(), "150/150 (150 changed)")
	stats, err = st.Store.(driver.Admin).Stats(ctx)
	require.NoError(t, err)
	require.Zero(t, stats.Parked)

	// Quiet runs print no bar.
	var out3, errOut3 strings.Builder
	require.Equal(t, exitOK, run(ctx, append([]string{"requeue"}, append(b.args, "-all", "-quiet")...), &out3, &errOut3))
	require.Contains(t, out3.String(), "requeued 0 of 0")
	require.Empty(t, errOut3.String())
}
