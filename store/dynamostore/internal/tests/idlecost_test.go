package tests

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// An idle relay holding every bucket of an empty table sends no more requests than
// the design's formula allows, plus 5 %: per PollInterval one probe per owned bucket,
// and per LeaseRenewInterval one coordination read, one heartbeat and one renewal per
// owned bucket (the backlog sample, which the formula leaves out, is off). Timings
// are a fifth of the defaults, so a few seconds hold several rounds. A busy machine
// only makes the relay slower, and so cheaper: the bound holds under load, and the
// test checks that the relay did run its rounds and probes meanwhile.
func TestIdleRelayCostsWhatTheDesignFormulaSays(t *testing.T) {
	t.Parallel()
	const buckets = 8
	cfg := relay.Config{
		RelayID:            "relay-idle-cost",
		BucketCount:        buckets,
		PollInterval:       200 * time.Millisecond,
		LeaseRenewInterval: 2 * time.Second,
		LeaseDuration:      6 * time.Second,
		BacklogInterval:    -1,
		Logger:             slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	d := newTestDB(t)
	table := d.newStore(t, dynamostore.Config{BucketCount: buckets}).Config()
	client := newCountingClient(d.client)
	s, err := dynamostore.New(client, table)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	r, err := relay.New(s, outboxtest.NewRecorder(), cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for !cond() {
			require.True(t, time.Now().Before(deadline), "timed out waiting for %s", what)
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("every bucket", func() bool { return len(r.Owned()) == buckets })
	rounds := r.Stats().Rounds
	waitFor("two more rounds", func() bool { return r.Stats().Rounds >= rounds+2 })

	client.take()
	begin := time.Now()
	rounds = r.Stats().Rounds
	window := 5 * cfg.LeaseRenewInterval
	time.Sleep(window)
	counts := client.take()
	elapsed := time.Since(begin)
	ran := r.Stats().Rounds - rounds

	perSecond := func(per time.Duration) float64 { return elapsed.Seconds() / per.Seconds() }
	formula := buckets*perSecond(cfg.PollInterval) + (1+1+buckets)*perSecond(cfg.LeaseRenewInterval)
	total := 0
	for _, n := range counts {
		total += n
	}
	t.Logf("%d requests in %s (%v), %d rounds; the formula allows %.0f", total, elapsed.Round(time.Millisecond), counts, ran, formula)
	assert.LessOrEqual(t, float64(total), 1.05*formula, "requests within 5 %% of the design's formula")
	assert.GreaterOrEqual(t, ran, int64(3), "the relay ran its rounds meanwhile")
	assert.Positive(t, counts["probe"], "the relay probed its buckets meanwhile")
	assert.LessOrEqual(t, counts["relay-read"], int(2*perSecond(cfg.LeaseRenewInterval/2)),
		"a relay alone reads the relay records once between two rounds")
}
