package tests

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// relayFleet runs relay workers over one table, each with its own store and
// recorder, as separate processes would.
type relayFleet struct {
	t      *testing.T
	d      *testDB
	opts   dynamostore.Config
	relays map[string]*relay.Relay
	recs   map[string]*outboxtest.Recorder
}

// Every store call of a relay has a deadline of one renew interval: 400 ms keeps a
// busy machine's slow calls within it, so steady state stays steady under load.
const (
	fleetRenew = 400 * time.Millisecond
	fleetLease = 4 * time.Second
)

func (f *relayFleet) start(id string) {
	f.t.Helper()
	s, err := dynamostore.New(f.d.client, f.opts)
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = s.Close() })
	rec := outboxtest.NewRecorder()
	disp, err := relay.New(s, rec, relay.Config{
		RelayID:            id,
		BucketCount:        f.opts.BucketCount,
		PollInterval:       50 * time.Millisecond,
		LeaseDuration:      fleetLease,
		LeaseRenewInterval: fleetRenew,
		Logger:             slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(f.t, err)
	require.NoError(f.t, disp.Start(context.Background()))
	f.t.Cleanup(func() { _ = disp.Stop(context.Background()) })
	f.relays[id], f.recs[id] = disp, rec
}

// waitFor waits until every bucket has exactly one owner among the running relays and
// their sorted bucket counts match want, then until every relay has begun one more
// coordination round; it fails after a deadline.
//
// The split can show in Owned while a round that read the coordination partition
// before it settled is still sending the claims it planned. Relays that start together
// do this: the first one's first round may see no peer heartbeat yet and plan to claim
// every bucket; the claims its peers won first are refused, as the protocol intends,
// and on a busy machine they reach the server after the split shows. They belong to
// the change the fleet settled from, not to the steady state that follows. A relay
// runs its rounds one at a time and Rounds counts a round when it begins, so once
// each relay has begun a round after the split showed, no write planned from an
// older view is left.
func (f *relayFleet) waitFor(want []int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var shares []int
		owners := map[int]int{}
		for _, d := range f.relays {
			owned := d.Owned()
			shares = append(shares, len(owned))
			for _, b := range owned {
				owners[b]++
			}
		}
		slices.Sort(shares)
		one := len(owners) == f.opts.BucketCount
		for _, n := range owners {
			one = one && n == 1
		}
		if one && slices.Equal(shares, want) {
			break
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("fleet did not settle on %v: shares %v, owners %v", want, shares, owners)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rounds := map[string]int64{}
	for id, r := range f.relays {
		rounds[id] = r.Stats().Rounds
	}
	f.waitRounds(rounds, 1)
}

// waitRounds waits until every relay ran at least n coordination rounds after the
// counts in since.
func (f *relayFleet) waitRounds(since map[string]int64, n int64) {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for id, r := range f.relays {
		for r.Stats().Rounds-since[id] < n {
			require.True(f.t, time.Now().Before(deadline), "relay %s ran %d rounds", id, r.Stats().Rounds-since[id])
			time.Sleep(fleetRenew / 2)
		}
	}
}

func (f *relayFleet) published() int {
	n := 0
	for _, r := range f.recs {
		n += r.Unique()
	}
	return n
}

// TestFleetMakesNoRefusedWritesInSteadyState runs three relays on one table through a
// proxy that counts every ConditionalCheckFailedException the server returns. Once the
// buckets are split, many rounds of renewals go by without a single refused write, and
// a relay joining or stopping gracefully costs at most a few.
func TestFleetMakesNoRefusedWritesInSteadyState(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 8})
	f := &relayFleet{t: t, d: d, opts: s.Config(), relays: map[string]*relay.Relay{}, recs: map[string]*outboxtest.Recorder{}}
	ctx := context.Background()

	// Writers keep enqueuing throughout.
	stopWriters := make(chan struct{})
	var writers sync.WaitGroup
	var stopOnce sync.Once
	// stop ends the writer; it also runs if the test fails early, so the writer never
	// reports after the test completed.
	stop := func() { stopOnce.Do(func() { close(stopWriters); writers.Wait() }) }
	t.Cleanup(stop)
	enqueued := 0
	writers.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stopWriters:
				return
			case <-time.After(10 * time.Millisecond):
			}
			if err := s.Driver().Enqueue(ctx, envelope(t, 8, "t", []byte{byte(i)}, []byte("x"))); err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			enqueued++
		}
	})

	for _, id := range []string{"relay-a", "relay-b", "relay-c"} {
		f.start(id)
	}
	f.waitFor([]int{2, 3, 3})
	startup := d.proxy.refusedSoFar()

	// Steady state: fifteen renewal rounds per relay.
	d.proxy.take()
	before := map[string][]int{}
	rounds := map[string]int64{}
	for id, r := range f.relays {
		before[id], rounds[id] = r.Owned(), r.Stats().Rounds
	}
	f.waitRounds(rounds, 15)
	reqs, refusals := d.proxy.takeRefusals()
	refused := len(refusals)
	for _, r := range refusals {
		t.Logf("refused in steady state: %v", r)
	}
	for id, r := range f.relays {
		assert.Equal(t, before[id], r.Owned(), "nothing moves in steady state (%s)", id)
	}
	assert.Zero(t, refused, "refused conditional writes in steady state")
	assert.NotZero(t, reqs["UpdateItem"], "renewals were sent")
	t.Logf("startup refused %d; steady state %v requests, %d refused", startup, reqs, refused)

	// A relay joins.
	f.start("relay-d")
	f.waitFor([]int{2, 2, 2, 2})
	_, refused = d.proxy.take()
	assert.LessOrEqual(t, refused, 2, "refused writes while a relay joins")
	t.Logf("join: %d refused", refused)

	// A relay stops gracefully; its peers take its buckets on their next round.
	stopped := f.relays["relay-c"]
	require.NoError(t, stopped.Stop(ctx))
	delete(f.relays, "relay-c")
	f.waitFor([]int{2, 3, 3})
	_, refused = d.proxy.take()
	assert.LessOrEqual(t, refused, 2, "refused writes while a relay stops gracefully")
	t.Logf("graceful stop: %d refused", refused)

	rec := rawItem(t, d, f.opts.TableName, "OUTBOX#COORDINATION", "RELAY#relay-c")
	require.NotNil(t, rec, "a stopped relay's record stays")
	assert.Contains(t, rec, "StoppedAtUtc")

	for id, r := range f.relays {
		rounds[id] = r.Stats().Rounds
	}
	f.waitRounds(rounds, 5)
	_, refusals = d.proxy.takeRefusals()
	for _, r := range refusals {
		t.Logf("refused in steady state again: %v", r)
	}
	assert.Empty(t, refusals, "steady again")

	// One lease duration after the stop, a survivor deletes the record.
	deadline := time.Now().Add(fleetLease + 20*fleetRenew)
	for rawItem(t, d, f.opts.TableName, "OUTBOX#COORDINATION", "RELAY#relay-c") != nil {
		require.True(t, time.Now().Before(deadline), "the stopped relay's record was never cleaned up")
		time.Sleep(50 * time.Millisecond)
	}

	stop()
	deadline = time.Now().Add(10 * time.Second)
	for f.published() < enqueued && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, f.published(), enqueued, "every enqueued message was published")
}
