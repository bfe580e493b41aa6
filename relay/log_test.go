package relay

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// logged is a relay on the fake clock over a store of two buckets, logging into a
// sink, publishing through a recorder.
func logged(t *testing.T, tune func(*Config)) (*clock, *memstore.Store, *outboxtest.Recorder, *logSink, *Relay) {
	t.Helper()
	c := newClock()
	store := newStore(t, 2)
	rec := outboxtest.NewRecorder()
	sink := &logSink{}
	cfg := testConfig(c, "r")
	cfg.Logger = sink.Logger()
	if tune != nil {
		tune(&cfg)
	}
	return c, store, rec, sink, newDispatcher(t, store, rec, cfg)
}

// enqueueIn writes one message whose key, named after name, lands in bucket b.
func enqueueIn(t *testing.T, handle driver.Handle, name string, b int) *driver.Envelope {
	t.Helper()
	store := handle.Driver()
	for i := 0; ; i++ {
		env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "%s-%d", name, i), Payload: []byte("x")}, store.BucketCount())
		require.NoError(t, err)
		if env.Bucket == b {
			require.NoError(t, store.Enqueue(context.Background(), env))
			return env
		}
	}
}

func requireAttrs(t *testing.T, r logRecord, want map[string]any) {
	t.Helper()
	for k, v := range want {
		got, ok := r.Attrs[k]
		require.True(t, ok, "attribute %q missing from %q", k, r.Msg)
		require.Equal(t, v, got.Any(), "attribute %q of %q", k, r.Msg)
	}
}

// A failed publish is a WARN with what an operator needs, at most once per bucket per
// LeaseRenewInterval; the failures in between are DEBUG and the next WARN counts them.
func TestPublishFailuresWarnOncePerBucketPerInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c, store, rec, sink, d := logged(t, func(cfg *Config) {
		cfg.MaxAttempts = 5
		cfg.LeaseRenewInterval = 10 * time.Second
	})
	env := enqueueIn(t, store, "a", 0)
	other := enqueueIn(t, store, "b", 1)
	rec.FailID(env.ID, errBroker, -1)
	rec.FailID(other.ID, errBroker, 1)
	failures := func() []logRecord { return sink.Records("publish failed") }

	// Attempt 1 of each, at once: one WARN per bucket.
	start := c.Now()
	_, err := d.RunOnce(ctx)
	require.NoError(t, err)
	got := failures()
	require.Len(t, got, 2)
	for _, r := range got {
		require.Equal(t, slog.LevelWarn, r.Level, "the first failure of each bucket is a WARN")
		requireAttrs(t, r, map[string]any{
			"relay":        "r",
			"topic":        "orders",
			"attempts":     int64(1),
			"next_attempt": start.Add(time.Second),
			"error":        errBroker.Error(),
			"suppressed":   int64(0),
		})
	}
	require.ElementsMatch(t, []any{env.ID, other.ID},
		[]any{got[0].Attrs["message_id"].Any(), got[1].Attrs["message_id"].Any()})

	// Attempts 2 and 3 of env (backoff 1 s, then 2 s) come within the interval: DEBUG.
	for _, step := range []time.Duration{time.Second, 2 * time.Second} {
		c.Advance(step)
		_, err := d.RunOnce(ctx)
		require.NoError(t, err)
	}
	got = failures()
	require.Len(t, got, 4)
	for _, r := range got[2:] {
		require.Equal(t, slog.LevelDebug, r.Level, "a failure within the interval is DEBUG")
		requireAttrs(t, r, map[string]any{"message_id": env.ID, "topic": "orders", "error": errBroker.Error()})
		require.NotContains(t, r.Attrs, "suppressed")
	}
	requireAttrs(t, got[3], map[string]any{"attempts": int64(3), "next_attempt": c.Now().Add(4 * time.Second)})

	// Attempt 4, ten seconds after the first WARN: a WARN that counts the two DEBUGs.
	c.Advance(7 * time.Second)
	require.Equal(t, start.Add(10*time.Second), c.Now())
	_, err = d.RunOnce(ctx)
	require.NoError(t, err)
	got = failures()
	require.Len(t, got, 5)
	require.Equal(t, slog.LevelWarn, got[4].Level)
	requireAttrs(t, got[4], map[string]any{"message_id": env.ID, "attempts": int64(4), "suppressed": int64(2),
		"next_attempt": c.Now().Add(8 * time.Second)})

	// Attempt 5 is the last: parking is always a WARN, however recent the last one.
	c.Advance(8 * time.Second)
	_, err = d.RunOnce(ctx)
	require.NoError(t, err)
	parked := sink.Records("parked")
	require.Len(t, parked, 1)
	require.Equal(t, slog.LevelWarn, parked[0].Level)
	requireAttrs(t, parked[0], map[string]any{"message_id": env.ID, "topic": "orders", "attempts": int64(5),
		"permanent": false, "error": errBroker.Error()})
	require.Len(t, failures(), 5, "a park is not also logged as a retry")
}

func TestPermanentFailureParksWithAWarning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, store, rec, sink, d := logged(t, nil)
	envs := []*driver.Envelope{enqueueIn(t, store, "a", 0), enqueueIn(t, store, "b", 0)}
	for _, e := range envs {
		rec.FailID(e.ID, driver.Permanent(errBroker), 1)
	}

	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Parked)
	parked := sink.Records("parked")
	require.Len(t, parked, 2, "every park is logged, in one bucket and one instant")
	for i, r := range parked {
		require.Equal(t, slog.LevelWarn, r.Level)
		requireAttrs(t, r, map[string]any{"message_id": envs[i].ID, "topic": "orders", "attempts": int64(1), "permanent": true})
		require.Contains(t, r.Attrs["error"].String(), errBroker.Error())
	}
	require.Empty(t, sink.Records("publish failed"))
}

// The rate limit both warnings share: the first record warns, the next ones within
// the interval go to DEBUG, the first a full interval on warns with their count, and
// so does one after the clock went back.
func TestWarnLimit(t *testing.T) {
	var w warnLimit
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type step struct {
		at         time.Duration
		warn       bool
		suppressed int
	}
	for i, s := range []step{
		{0, true, 0},
		{time.Second, false, 0},
		{9 * time.Second, false, 0},
		{10 * time.Second, true, 2},
		{11 * time.Second, false, 0},
		{5 * time.Second, true, 1}, // the clock went back
		{6 * time.Second, false, 0},
	} {
		warn, suppressed := w.next(t0.Add(s.at), 10*time.Second)
		require.Equal(t, s.warn, warn, "step %d", i)
		require.Equal(t, s.suppressed, suppressed, "step %d", i)
	}
}
