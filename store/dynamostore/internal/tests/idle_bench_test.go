package tests

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// BenchmarkPollCost measures what a polling worker costs per poll of a bucket, in
// requests counted at the proxy: an idle bucket ("idle"), and a bucket whose only key
// is blocked by a head that backs off, with 100 messages of 1 KiB behind it, fetched
// with the default batch of 100 ("blocked-full": the window is full) and with a batch
// of 200 ("blocked-whole": the window holds the whole bucket). Each iteration is one
// poll of bucket 0; bucket 1 stays idle beside it. Run with -benchtime=100x.
//
// The per-poll figures and the coordination figures (per round, and relay reads per
// poll) give the requests per idle second at any poll and renew interval; see the
// store's guide.
func BenchmarkPollCost(b *testing.B) {
	for _, tc := range []struct {
		name    string
		batch   int
		blocked bool
	}{
		{"idle", 100, false},
		{"blocked-full", 100, true},
		{"blocked-whole", 200, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d := newTestDB(b)
			s := d.newStore(b, dynamostore.Config{BucketCount: 2})
			ctx := context.Background()
			rec := outboxtest.NewRecorder()
			if tc.blocked {
				key := keyForBucket(b, 0, 2)
				head := envelope(b, 2, "t", key, []byte("head"))
				require.NoError(b, s.Driver().Enqueue(ctx, head))
				for i := 0; i < 100; i += 50 {
					envs := make([]*driver.Envelope, 50)
					for j := range envs {
						envs[j] = envelope(b, 2, "t", key, bytes.Repeat([]byte{'x'}, 1024))
					}
					require.NoError(b, s.Driver().Enqueue(ctx, envs...))
				}
				rec.FailID(head.ID, errors.New("broker refused"), -1)
			}
			store := &pollCounter{relaySide: side(s)}
			const poll = 10 * time.Millisecond
			disp, err := relay.New(store, rec, relay.Config{
				RelayID: "relay-cost", BucketCount: 2, BatchSize: tc.batch, PollInterval: poll,
				LeaseRenewInterval: 500 * time.Millisecond, LeaseDuration: 5 * time.Second,
				BackoffBase: time.Hour, BackoffMax: time.Hour, BacklogInterval: -1,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			require.NoError(b, err)
			require.NoError(b, disp.Start(ctx))
			defer func() { _ = disp.Stop(context.Background()) }()
			// Settle: buckets owned, the head failed once, two polls since.
			deadline := time.Now().Add(time.Minute)
			for len(disp.Owned()) < 2 || (tc.blocked && disp.Stats().Retried < 1) {
				require.True(b, time.Now().Before(deadline), "the worker did not settle")
				time.Sleep(poll)
			}
			for p := store.polls[0].Load(); store.polls[0].Load() < p+2; {
				time.Sleep(poll / 2)
			}
			r0, r1 := requestsOf(d, 0), requestsOf(d, 1)
			p0, p1 := store.polls[0].Load(), store.polls[1].Load()
			rounds := disp.Stats().Rounds
			coordFetches, relayReads := d.proxy.queriesOf("OUTBOX#COORDINATION")
			d.proxy.take()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				for store.polls[0].Load() < p0+int64(i)+1 {
					time.Sleep(poll / 4)
				}
			}
			b.StopTimer()
			blocked, idle := requestsOf(d, 0).minus(r0), requestsOf(d, 1).minus(r1)
			polls0, polls1 := float64(store.polls[0].Load()-p0), float64(store.polls[1].Load()-p1)
			c, rr := d.proxy.queriesOf("OUTBOX#COORDINATION")
			reqs, _ := d.proxy.take()
			nRounds := float64(disp.Stats().Rounds - rounds)
			b.ReportMetric(float64(blocked.fetches+blocked.probes+blocked.counters)/polls0, "bucket0-requests/poll")
			b.ReportMetric(float64(blocked.fetches)/polls0, "bucket0-fetches/poll")
			b.ReportMetric(float64(idle.fetches+idle.probes+idle.counters)/polls1, "idle-bucket-requests/poll")
			b.ReportMetric(float64(rr-relayReads)/polls0, "relay-reads/poll")
			if nRounds > 0 {
				b.ReportMetric(float64(c-coordFetches)/nRounds, "coordination-reads/round")
				b.ReportMetric(float64(reqs["PutItem"]+reqs["UpdateItem"])/nRounds, "lease+heartbeat-writes/round")
			}
		})
	}
}
