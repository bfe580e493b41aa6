package tests

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// brokerLatency stands for a broker's round trip: every Publish call takes it.
type brokerLatency struct {
	*outboxtest.Recorder
	rtt time.Duration
}

func (b brokerLatency) Publish(ctx context.Context, batch []*driver.Envelope) error {
	select {
	case <-time.After(b.rtt):
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.Recorder.Publish(ctx, batch)
}

// fleetRelay starts a worker with default timings on s.
func fleetRelay(b *testing.B, s *sqlstore.Store, tr driver.Transport, id string) *relay.Relay {
	d, err := relay.New(s, tr, relay.Config{RelayID: id, Logger: quietLog})
	require.NoError(b, err)
	require.NoError(b, d.Start(context.Background()))
	b.Cleanup(d.Kill)
	return d
}

// until polls cond every millisecond and returns how long it took to hold.
func until(b *testing.B, what string, cond func() bool) time.Duration {
	start := time.Now()
	for !cond() {
		require.Less(b, time.Since(start), 2*time.Minute, what)
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// BenchmarkFleet measures, on PostgreSQL with the dispatcher's default timings (a
// round every 10 s in steady state), how fast a fleet of two relays shares the work:
//
//   - join-ms: from starting a relay beside one that holds all 16 buckets to both
//     holding 8;
//   - stop-ms: from a graceful Stop of one of them to the other holding all 16;
//   - drain-2x1: how much faster two relays started together drain a backlog of
//     20,000 messages than one relay (each Publish call waits 2 ms, a broker's round
//     trip), convergence included.
//
// Run it with:
//
//	go test -run '^$' -bench BenchmarkFleet -benchtime 3x ./store/sqlstore/internal/tests/
func BenchmarkFleet(b *testing.B) {
	ctx := context.Background()
	payload := randomPayload(256)
	var join, stop, one, two time.Duration
	for b.Loop() {
		s := pgxBackend().open(b, sqlstore.Config{})
		n := s.Config().BucketCount
		a := fleetRelay(b, s, outboxtest.NewRecorder(), "a")
		until(b, "a holds every bucket", func() bool { return len(a.Owned()) == n })
		c := fleetRelay(b, s, outboxtest.NewRecorder(), "b")
		join += until(b, "fair share after a join", func() bool { return len(a.Owned()) == n/2 && len(c.Owned()) == n/2 })
		start := time.Now()
		require.NoError(b, a.Stop(ctx))
		stop += time.Since(start) + until(b, "takeover after a stop", func() bool { return len(c.Owned()) == n })
		c.Kill()

		for relays, total := range map[int]*time.Duration{1: &one, 2: &two} {
			s := pgxBackend().open(b, sqlstore.Config{})
			fill(b, ctx, s, 20_000, payload)
			rec := outboxtest.NewRecorder()
			tr := brokerLatency{Recorder: rec, rtt: 2 * time.Millisecond}
			start := time.Now()
			for i := range relays {
				fleetRelay(b, s, tr, string(rune('p'+i)))
			}
			until(b, "the backlog drains", func() bool { return rec.Unique() == 20_000 })
			*total += time.Since(start)
		}
	}
	runs := float64(b.N)
	b.ReportMetric(float64(join.Milliseconds())/runs, "join-ms")
	b.ReportMetric(float64(stop.Milliseconds())/runs, "stop-ms")
	b.ReportMetric(one.Seconds()/two.Seconds(), "drain-2x1")
}
