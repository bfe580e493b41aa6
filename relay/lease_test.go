package relay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// fleet is a set of relays over one memory store, on one shared clock with a skew per
// relay, driven round by round.
type fleet struct {
	t      *testing.T
	store  *memstore.Store
	clock  *clock
	mu     sync.Mutex
	skew   map[string]*time.Duration
	relays map[string]*Relay
}

func newFleet(t *testing.T, buckets int) *fleet {
	return &fleet{t: t, store: newStore(t, buckets), clock: newClock(),
		skew: map[string]*time.Duration{}, relays: map[string]*Relay{}}
}

func (f *fleet) add(id string) *Relay {
	f.t.Helper()
	return f.addWith(id, outboxtest.NewRecorder())
}

// addWith adds a relay that publishes through tr.
func (f *fleet) addWith(id string, tr driver.Transport) *Relay {
	f.t.Helper()
	skew := new(time.Duration)
	f.skew[id] = skew
	cfg := Config{
		RelayID:            id,
		LeaseDuration:      testLD,
		LeaseRenewInterval: testRI,
		Logger:             quietLogger(),
		Now:                f.clock.offset(skew, &f.mu),
	}
	d, err := New(f.store, tr, cfg)
	require.NoError(f.t, err)
	f.relays[id] = d
	return d
}

func (f *fleet) setSkew(id string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	*f.skew[id] = d
}

// round runs one coordination round of each named relay, checking the one-owner
// invariant after every relay's writes.
func (f *fleet) round(ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		_, err := f.relays[id].coord.coordinate(context.Background())
		require.NoError(f.t, err)
		f.checkOneOwner()
	}
}

// checkOneOwner fails if two relays may publish one bucket at this instant.
func (f *fleet) checkOneOwner() {
	f.t.Helper()
	owner := map[int]string{}
	for id, d := range f.relays {
		for _, b := range d.Owned() {
			if prev, ok := owner[b]; ok {
				f.t.Fatalf("bucket %d publishable by %s and %s at %s", b, prev, id, f.clock.Now())
			}
			owner[b] = id
		}
	}
}

func (f *fleet) shares(ids ...string) []int {
	var out []int
	for _, id := range ids {
		out = append(out, len(f.relays[id].Owned()))
	}
	return out
}

func (f *fleet) refused(ids ...string) int64 {
	var n int64
	for _, id := range ids {
		n += f.relays[id].Stats().RefusedWrites
	}
	return n
}

func (f *fleet) owners() map[int]string {
	view, err := f.store.Driver().ReadCoordination(context.Background())
	require.NoError(f.t, err)
	out := map[int]string{}
	for _, l := range view.Leases {
		if l.Owner != "" && l.ExpiresAt.After(f.clock.Now()) {
			out[l.Bucket] = l.Owner
		}
	}
	return out
}

func TestThreeRelaysConvergeWithoutRefusedWrites(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 8)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		f.add(id)
	}
	for range 3 {
		f.round(ids...)
		f.clock.Advance(testRI)
	}
	shares := f.shares(ids...)
	slices.Sort(shares)
	require.Equal(t, []int{2, 3, 3}, shares)
	require.Len(t, f.owners(), 8)

	// Steady state: renewals only, nothing refused, nothing moves.
	before := f.owners()
	for range 10 {
		f.round(ids...)
		f.clock.Advance(testRI)
	}
	require.Equal(t, before, f.owners())
	require.Zero(t, f.refused(ids...))
}

func TestJoiningRelayTakesItsShare(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 8)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		f.add(id)
	}
	for range 3 {
		f.round(ids...)
		f.clock.Advance(testRI)
	}
	f.add("d")
	ids = append(ids, "d")
	for range 2 {
		f.round(ids...)
		f.clock.Advance(testRI)
	}
	require.Equal(t, []int{2, 2, 2, 2}, f.shares(ids...))
	require.Zero(t, f.refused(ids...))
}

func TestGracefulStopHandsBucketsOverNextRound(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 8)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		f.add(id)
	}
	for range 3 {
		f.round(ids...)
		f.clock.Advance(testRI)
	}
	require.NoError(t, f.relays["c"].coord.resign(context.Background()))
	f.checkOneOwner()
	require.Empty(t, f.relays["c"].Owned())
	f.clock.Advance(time.Second) // well within the lease
	f.round("a", "b")
	require.Equal(t, []int{4, 4}, f.shares("a", "b"), "peers take the buckets on their next round")
	require.Zero(t, f.refused(ids...))

	// The stopped record goes one lease duration later.
	f.clock.Advance(testLD)
	f.round("a", "b")
	view, err := f.store.Driver().ReadCoordination(context.Background())
	require.NoError(t, err)
	for _, r := range view.Relays {
		require.NotEqual(t, "c", r.ID)
	}
}

func TestCrashedRelayLosesBucketsOnlyAfterTheLease(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 8)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		f.add(id)
	}
	for range 3 {
		f.round(ids...)
		f.clock.Advance(testRI)
	}
	f.round(ids...)
	crashedAt := f.clock.Now()
	var lost []int
	for b, id := range f.owners() {
		if id == "c" {
			lost = append(lost, b)
		}
	}
	require.NotEmpty(t, lost)
	delete(f.relays, "c") // it stops running: no release, no heartbeat

	step := time.Second
	for f.clock.Now().Before(crashedAt.Add(testLD + testRI)) {
		f.clock.Advance(step)
		f.round("a", "b")
		owners := f.owners()
		for _, b := range lost {
			if f.clock.Now().Before(crashedAt.Add(testLD)) {
				require.Equal(t, "c", owners[b], "bucket %d moved before the lease lapsed", b)
			}
		}
	}
	require.Equal(t, []int{4, 4}, f.shares("a", "b"), "survivors split the lapsed buckets")
	require.Zero(t, f.refused("a", "b"))

	// A dead relay's record is deleted after ten lease durations.
	for range 11 {
		f.clock.Advance(testLD)
		f.round("a", "b")
	}
	view, err := f.store.Driver().ReadCoordination(context.Background())
	require.NoError(t, err)
	require.Len(t, view.Relays, 2)
}

func TestClockSetBackPublishesNothingAndClaimsNothing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 4)
	f.add("a")
	f.add("b")
	for range 3 {
		f.round("a", "b")
		f.clock.Advance(testRI)
	}
	require.Equal(t, []int{2, 2}, f.shares("a", "b"))
	mine := f.relays["a"].Owned()

	f.setSkew("a", -2*testRI)
	f.round("a")
	require.Empty(t, f.relays["a"].Owned(), "publishes nothing from leases it cannot renew")
	require.EqualValues(t, 1, f.relays["a"].Stats().RefusedWrites, "only the heartbeat is refused")
	owners := f.owners()
	for _, b := range mine {
		require.Equal(t, "a", owners[b], "no renewal moved bucket %d backwards and nobody took it", b)
	}

	// "b" stops: "a" still claims nothing while its heartbeat is refused.
	require.NoError(t, f.relays["b"].coord.resign(context.Background()))
	f.clock.Advance(time.Second)
	f.round("a")
	require.Empty(t, f.relays["a"].Owned())
	for b, id := range f.owners() {
		require.Equal(t, "a", id, "bucket %d", b)
	}

	// Once its clock passes the stored times it takes everything back.
	f.clock.Advance(2 * testRI)
	f.round("a")
	f.clock.Advance(testRI)
	f.round("a")
	require.Len(t, f.relays["a"].Owned(), 4)
}

func TestStallPastTheLeaseStopsPublishing(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 4)
	f.add("a")
	f.add("b")
	for range 3 {
		f.round("a", "b")
		f.clock.Advance(testRI)
	}
	f.round("a", "b")
	stalled := f.relays["a"].Owned()
	require.Len(t, stalled, 2)

	// "a" stalls. Near the end of its lease it stops publishing by itself.
	f.clock.Advance(testLD - testRI/4)
	require.Empty(t, f.relays["a"].Owned(), "no publishing on a lease about to lapse")
	f.clock.Advance(testRI / 4)
	f.round("b")
	require.Len(t, f.relays["b"].Owned(), 4, "the peer takes the lapsed buckets")

	// "a" wakes up: its renewals would be refused; it owns nothing and takes its share
	// back only when "b" hands one over.
	f.round("a")
	require.Empty(t, f.relays["a"].Owned())
	f.clock.Advance(testRI)
	f.round("b", "a")
	require.Equal(t, []int{2, 2}, f.shares("a", "b"))
}

func TestFleetNeverHasTwoOwners(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 9))
		f := newFleet(t, 1+rng.IntN(12))
		var live []string
		next := 0
		join := func() {
			id := fmt.Sprintf("r%02d", next)
			next++
			f.add(id)
			live = append(live, id)
		}
		for range 3 {
			join()
		}
		for step := range 400 {
			switch x := rng.IntN(100); {
			case x < 5 && len(live) < 10:
				join()
			case x < 8 && len(live) > 1: // graceful stop
				i := rng.IntN(len(live))
				require.NoError(t, f.relays[live[i]].coord.resign(context.Background()))
				delete(f.relays, live[i])
				live = slices.Delete(live, i, i+1)
			case x < 10 && len(live) > 1: // crash
				i := rng.IntN(len(live))
				delete(f.relays, live[i])
				live = slices.Delete(live, i, i+1)
			case x < 13: // a stall: some relay skips rounds while time passes
				f.clock.Advance(time.Duration(rng.Int64N(int64(2 * testLD))))
			default:
				f.round(live[rng.IntN(len(live))])
			}
			f.clock.Advance(time.Duration(rng.Int64N(int64(testRI / 2))))
			f.checkOneOwner()
			_ = step
		}
		// Quiet down: everyone runs rounds until the split is fair and steady.
		for range 8 {
			f.clock.Advance(testRI)
			f.round(live...)
		}
		before := f.refused(live...)
		for range 5 {
			f.clock.Advance(testRI)
			f.round(live...)
		}
		require.Equal(t, before, f.refused(live...), "seed %d: steady state refuses nothing", seed)
		shares := f.shares(live...)
		require.LessOrEqual(t, slices.Max(shares)-slices.Min(shares), 1, "seed %d: %v", seed, shares)
	}
}

func TestStandbysWhenRelaysOutnumberBuckets(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 2)
	ids := []string{"a", "b", "c", "d", "e"}
	for _, id := range ids {
		f.add(id)
	}
	for range 3 {
		f.round(ids...)
		f.clock.Advance(testRI)
	}
	total := 0
	standbys := 0
	for _, s := range f.shares(ids...) {
		total += s
		if s == 0 {
			standbys++
		}
	}
	require.Equal(t, 2, total)
	require.Equal(t, 3, standbys)
	require.Zero(t, f.refused(ids...))

	// An owner stops: the first standby in id order steps in on its next round.
	var owner string
	for _, id := range ids {
		if len(f.relays[id].Owned()) > 0 {
			owner = id
			break
		}
	}
	require.NoError(t, f.relays[owner].coord.resign(context.Background()))
	rest := slices.DeleteFunc(slices.Clone(ids), func(s string) bool { return s == owner })
	f.clock.Advance(time.Second)
	f.round(rest...)
	total = 0
	for _, s := range f.shares(rest...) {
		total += s
	}
	require.Equal(t, 2, total)
	require.Zero(t, f.refused(ids...))

	// Standbys far back in line skip every other round when timings allow.
	far := f.relays[rest[len(rest)-1]]
	far.coord.lastPlan = leasePlan{Standby: true, StandbyRank: 5}
	far.coord.round = 1
	require.True(t, far.coord.skipRound())
	require.False(t, far.coord.skipRound())
}

var _ driver.Handle = (*stallingStore)(nil)

// stallingStore runs a hook after a read, as if the relay stalled between reading
// the leases and sending its renewals.
type stallingStore struct {
	memDriver
	afterRead func()
}

func (s *stallingStore) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	view, err := s.memDriver.ReadCoordination(ctx)
	if s.afterRead != nil {
		hook := s.afterRead
		s.afterRead = nil
		hook()
	}
	return view, err
}

func (s *stallingStore) Driver() driver.Store { return s }

func TestInFlightRenewalAfterAStallIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 4)
	f.add("b")
	stalling := &stallingStore{memDriver: relaySide(f.store)}
	cfg := Config{RelayID: "a", LeaseDuration: testLD, LeaseRenewInterval: testRI,
		Logger: quietLogger(), Now: f.clock.Now}
	a, err := New(stalling, outboxtest.NewRecorder(), cfg)
	require.NoError(t, err)
	f.relays["a"] = a
	for range 3 {
		f.round("a", "b")
		f.clock.Advance(testRI)
	}
	require.Equal(t, []int{2, 2}, f.shares("a", "b"))

	// "a" reads, then stalls past its lease; "b" takes the lapsed buckets meanwhile.
	stalling.afterRead = func() {
		f.clock.Advance(testLD)
		_, err := f.relays["b"].coord.coordinate(ctx)
		require.NoError(t, err)
	}
	_, err = a.coord.coordinate(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, a.Stats().RefusedWrites, "one refused renewal per lost bucket")
	require.Empty(t, a.Owned())
	require.Len(t, f.relays["b"].Owned(), 4)
	f.checkOneOwner()
}

// A round slowed past the expiry of a lease it planned to renew must not revive it:
// every lease write reads the clock as it is sent.
func TestRenewalOfALeaseThatLapsedDuringTheRoundIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFleet(t, 2)
	stalling := &stallingStore{memDriver: relaySide(f.store)}
	cfg := Config{RelayID: "a", LeaseDuration: testLD, LeaseRenewInterval: testRI,
		Logger: quietLogger(), Now: f.clock.Now}
	a, err := New(stalling, outboxtest.NewRecorder(), cfg)
	require.NoError(t, err)
	f.relays["a"] = a
	f.round("a")
	require.Equal(t, []int{0, 1}, a.Owned())
	before, err := f.store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)

	// A round later "a" reads, then stalls past its leases before renewing; nobody
	// else runs.
	f.clock.Advance(testRI)
	stalling.afterRead = func() { f.clock.Advance(testLD) }
	_, err = a.coord.coordinate(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, a.Stats().RefusedWrites, "both renewals of lapsed leases are refused")
	require.Empty(t, a.Owned(), "a relay publishes nothing from a lease that lapsed")
	after, err := f.store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	require.Equal(t, before.Leases, after.Leases, "the lapsed leases were not revived")

	// The next round claims the free buckets afresh.
	f.clock.Advance(testRI)
	f.round("a")
	require.Equal(t, []int{0, 1}, a.Owned())
}
