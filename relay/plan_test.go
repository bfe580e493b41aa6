package relay

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
)

const (
	testLD = 30 * time.Second
	testRI = 10 * time.Second
)

var epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// randomView builds a random membership and lease state: relays active, stopped or
// dead; leases absent, free, held (validly or lapsed) by known or unknown relays.
func randomView(rng *rand.Rand, now time.Time) (driver.Coordination, int) {
	n := 1 + rng.IntN(16)
	k := rng.IntN(20)
	var view driver.Coordination
	var ids []string
	for i := range k {
		id := fmt.Sprintf("relay-%02d", i)
		ids = append(ids, id)
		r := driver.RelayRecord{ID: id}
		switch rng.IntN(6) {
		case 0: // stopped
			r.LastSeen = now.Add(-time.Duration(rng.Int64N(int64(2 * testLD))))
			r.StoppedAt = r.LastSeen
		case 1: // dead
			r.LastSeen = now.Add(-testLD - time.Duration(rng.Int64N(int64(testLD))))
		default: // active
			r.LastSeen = now.Add(-time.Duration(rng.Int64N(int64(testLD))))
		}
		view.Relays = append(view.Relays, r)
	}
	for b := range n {
		switch rng.IntN(5) {
		case 0: // never leased
			continue
		case 1:
			view.Leases = append(view.Leases, driver.Lease{Bucket: b, ExpiresAt: now.Add(-time.Second)})
		default:
			owner := "ghost"
			if len(ids) > 0 && rng.IntN(6) > 0 {
				owner = ids[rng.IntN(len(ids))]
			}
			exp := now.Add(time.Duration(rng.Int64N(int64(testLD))) + time.Microsecond)
			if rng.IntN(4) == 0 {
				exp = now.Add(-time.Duration(rng.Int64N(int64(testLD))))
			}
			view.Leases = append(view.Leases, driver.Lease{Bucket: b, Owner: owner, ExpiresAt: exp})
		}
	}
	return view, n
}

func relayIDs(view driver.Coordination) []string {
	var ids []string
	for _, r := range view.Relays {
		ids = append(ids, r.ID)
	}
	for _, l := range view.Leases {
		if l.Owner != "" && !slices.Contains(ids, l.Owner) {
			ids = append(ids, l.Owner)
		}
	}
	return append(ids, "newcomer")
}

func params(n int) planParams {
	return planParams{BucketCount: n, LeaseDuration: testLD, StopHold: testRI}
}

func leaseOf(view driver.Coordination, b int) (driver.Lease, bool) {
	for _, l := range view.Leases {
		if l.Bucket == b {
			return l, true
		}
	}
	return driver.Lease{}, false
}

func TestPlanEveryBucketAtMostOneOwner(t *testing.T) {
	t.Parallel()
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 1))
		now := epoch
		view, n := randomView(rng, now)
		owners := make(map[int]string)
		for _, id := range relayIDs(view) {
			p := planRound(view, id, now, params(n))
			for _, b := range p.Claim {
				l, ok := leaseOf(view, b)
				require.True(t, !ok || l.Free(now), "seed %d: %s claims bucket %d that is not free: %+v", seed, id, b, l)
			}
			for _, l := range slices.Concat(p.Renew, p.Hold, p.Release) {
				require.Equal(t, id, l.Owner, "seed %d", seed)
				require.True(t, l.ExpiresAt.After(now), "seed %d: %s plans on a lapsed lease %+v", seed, id, l)
			}
			for b := range n {
				if !p.owns(b) {
					continue
				}
				if prev, taken := owners[b]; taken {
					t.Fatalf("seed %d: bucket %d owned by %s and %s in one view", seed, b, prev, id)
				}
				owners[b] = id
			}
		}
	}
}

func TestPlanIsDeterministic(t *testing.T) {
	t.Parallel()
	for seed := range uint64(1000) {
		rng := rand.New(rand.NewPCG(seed, 2))
		now := epoch
		view, n := randomView(rng, now)
		for _, id := range relayIDs(view) {
			a := planRound(view, id, now, params(n))
			// The same view in another order is the same input.
			shuffled := driver.Coordination{Leases: slices.Clone(view.Leases), Relays: slices.Clone(view.Relays)}
			rng.Shuffle(len(shuffled.Relays), func(i, j int) {
				shuffled.Relays[i], shuffled.Relays[j] = shuffled.Relays[j], shuffled.Relays[i]
			})
			b := planRound(shuffled, id, now, params(n))
			require.True(t, reflect.DeepEqual(a, b), "seed %d relay %s:\n%+v\n%+v", seed, id, a, b)
		}
	}
}

func TestPlanKeepsHeldBucketsWhenTheSplitAllows(t *testing.T) {
	t.Parallel()
	for seed := range uint64(2000) {
		rng := rand.New(rand.NewPCG(seed, 3))
		now := epoch
		view, n := randomView(rng, now)
		var plans []leasePlan
		var holdsMore int // active relays holding more than the base share
		var active int
		for _, r := range view.Relays {
			if r.Stopped() || now.Sub(r.LastSeen) >= testLD {
				continue
			}
			active++
		}
		if active == 0 {
			continue
		}
		base, extra := n/active, n%active
		for _, r := range view.Relays {
			if r.Stopped() || now.Sub(r.LastSeen) >= testLD {
				continue
			}
			p := planRound(view, r.ID, now, params(n))
			plans = append(plans, p)
			held := len(p.Renew) + len(p.Hold) + len(p.Release)
			require.Contains(t, []int{base, base + 1}, p.Share, "seed %d", seed)
			require.Equal(t, max(0, held-p.Share), len(p.Release), "seed %d %s: hands back only its excess", seed, r.ID)
			if held <= base {
				require.Empty(t, p.Release, "seed %d %s holds %d <= base %d", seed, r.ID, held, base)
			}
			if held > base {
				holdsMore++
			}
		}
		// The extra buckets go to relays that already hold more than the base share.
		plusOne := 0
		keptPlusOne := 0
		for _, p := range plans {
			held := len(p.Renew) + len(p.Hold) + len(p.Release)
			if p.Share == base+1 {
				plusOne++
				if held > base {
					keptPlusOne++
				}
			}
		}
		require.Equal(t, extra, plusOne, "seed %d", seed)
		require.Equal(t, min(extra, holdsMore), keptPlusOne, "seed %d: current holders keep the extra buckets", seed)
	}
}

func TestPlanClockSetBackClaimsNothing(t *testing.T) {
	t.Parallel()
	for seed := range uint64(1000) {
		rng := rand.New(rand.NewPCG(seed, 4))
		now := epoch
		view, n := randomView(rng, now)
		self := "relay-self"
		// The stored heartbeat is ahead of this relay's clock.
		ahead := time.Duration(1+rng.Int64N(int64(testLD))) * time.Nanosecond
		view.Relays = append(view.Relays, driver.RelayRecord{ID: self, LastSeen: now.Add(ahead)})
		// Some of its leases were renewed before the clock went back.
		for i := range view.Leases {
			if rng.IntN(3) == 0 {
				view.Leases[i].Owner = self
				view.Leases[i].ExpiresAt = now.Add(testLD + ahead)
			}
		}
		p := planRound(view, self, now, params(n))
		require.True(t, p.ClockBehind, "seed %d", seed)
		require.Empty(t, p.Claim, "seed %d", seed)
		for _, l := range p.Renew {
			require.False(t, l.ExpiresAt.After(now.Add(testLD)), "seed %d: renewal would move bucket %d backwards", seed, l.Bucket)
		}
	}
}

// model applies plans to leases as a store would, conditionally, and counts refusals.
type model struct {
	n       int
	leases  map[int]driver.Lease
	relays  map[string]driver.RelayRecord
	refused int
}

func (m *model) view() driver.Coordination {
	var v driver.Coordination
	for b := range m.n {
		if l, ok := m.leases[b]; ok {
			v.Leases = append(v.Leases, l)
		}
	}
	for _, r := range m.relays {
		v.Relays = append(v.Relays, r)
	}
	slices.SortFunc(v.Relays, func(a, b driver.RelayRecord) int {
		if a.ID < b.ID {
			return -1
		}
		if a.ID > b.ID {
			return 1
		}
		return 0
	})
	return v
}

func (m *model) apply(id string, p leasePlan, now time.Time) {
	exp := now.Add(testLD)
	for _, l := range p.Renew {
		s := m.leases[l.Bucket]
		if s.Owner != l.Owner || !s.ExpiresAt.Equal(l.ExpiresAt) || !s.ExpiresAt.After(now) {
			m.refused++
			continue
		}
		m.leases[l.Bucket] = driver.Lease{Bucket: l.Bucket, Owner: id, ExpiresAt: exp}
	}
	for _, l := range p.Release {
		s := m.leases[l.Bucket]
		if s.Owner != l.Owner || !s.ExpiresAt.Equal(l.ExpiresAt) {
			m.refused++
			continue
		}
		m.leases[l.Bucket] = driver.Lease{Bucket: l.Bucket, ExpiresAt: s.ExpiresAt}
	}
	for _, b := range p.Claim {
		if s, ok := m.leases[b]; ok && !s.Free(now) {
			m.refused++
			continue
		}
		m.leases[b] = driver.Lease{Bucket: b, Owner: id, ExpiresAt: exp}
	}
}

func TestPlanConvergesToFairShares(t *testing.T) {
	t.Parallel()
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 5))
		now := epoch
		n := 1 + rng.IntN(16)
		k := 1 + rng.IntN(12)
		m := &model{n: n, leases: map[int]driver.Lease{}, relays: map[string]driver.RelayRecord{}}
		var ids []string
		for i := range k {
			ids = append(ids, fmt.Sprintf("r%02d", i))
		}
		// Random starting holdings among the relays.
		for b := range n {
			if rng.IntN(3) > 0 {
				m.leases[b] = driver.Lease{Bucket: b, Owner: ids[rng.IntN(k)], ExpiresAt: now.Add(testLD / 2)}
			}
		}
		for round := range 6 {
			now = now.Add(testRI)
			for _, id := range ids {
				m.relays[id] = driver.RelayRecord{ID: id, LastSeen: now}
			}
			view := m.view()
			before := maps(m.leases)
			for _, id := range ids {
				m.apply(id, planRound(view, id, now, params(n)), now)
			}
			require.Zero(t, m.refused, "seed %d round %d: relays reading one view never collide", seed, round)
			if round >= 3 {
				// Converged: quiet rounds only renew.
				require.Equal(t, owners(before), owners(m.leases), "seed %d round %d: nothing moves once converged", seed, round)
			}
		}
		counts := map[string]int{}
		for b := range n {
			l := m.leases[b]
			require.NotEmpty(t, l.Owner, "seed %d: bucket %d has no owner after convergence", seed, b)
			counts[l.Owner]++
		}
		lo, hi := n, 0
		for _, id := range ids {
			lo, hi = min(lo, counts[id]), max(hi, counts[id])
		}
		require.LessOrEqual(t, hi-lo, 1, "seed %d: shares %v", seed, counts)
	}
}

func maps(m map[int]driver.Lease) map[int]driver.Lease {
	out := make(map[int]driver.Lease, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func owners(m map[int]driver.Lease) map[int]string {
	out := make(map[int]string, len(m))
	for k, v := range m {
		out[k] = v.Owner
	}
	return out
}

func TestPlanStandbysWhenRelaysOutnumberBuckets(t *testing.T) {
	t.Parallel()
	now := epoch
	view := driver.Coordination{}
	for i := range 6 {
		view.Relays = append(view.Relays, driver.RelayRecord{ID: fmt.Sprintf("r%d", i), LastSeen: now})
	}
	// r5 (sorting last) holds bucket 0: it keeps it although r0 sorts first.
	view.Leases = []driver.Lease{{Bucket: 0, Owner: "r5", ExpiresAt: now.Add(testLD)}}
	p := planRound(view, "r5", now, params(2))
	require.Equal(t, 1, p.Share)
	require.Len(t, p.Renew, 1)
	require.Empty(t, p.Release)
	// r0 takes the free bucket; r1..r4 are standbys in id order.
	p0 := planRound(view, "r0", now, params(2))
	require.Equal(t, []int{1}, p0.Claim)
	for i := 1; i <= 4; i++ {
		p := planRound(view, fmt.Sprintf("r%d", i), now, params(2))
		require.True(t, p.Standby)
		require.Equal(t, i-1, p.StandbyRank)
		require.Empty(t, p.Claim)
	}
}

func TestPlanLeavesADeadRelaysLeasesUntilTheyLapse(t *testing.T) {
	t.Parallel()
	now := epoch
	view := driver.Coordination{
		Relays: []driver.RelayRecord{{ID: "a", LastSeen: now}, {ID: "dead", LastSeen: now.Add(-testLD)}},
		Leases: []driver.Lease{{Bucket: 0, Owner: "dead", ExpiresAt: now.Add(time.Second)}},
	}
	p := planRound(view, "a", now, params(2))
	require.Equal(t, []int{1}, p.Claim, "the dead relay's valid lease is reserved")
	p = planRound(view, "a", now.Add(time.Second), params(2))
	require.Equal(t, []int{0, 1}, p.Claim, "once lapsed, the survivor takes it")
}

// settled runs rounds on one shared view per round until nothing moves, and returns
// the model and the time of its last round.
func settled(t *testing.T, n int, ids []string) (*model, time.Time) {
	t.Helper()
	m := &model{n: n, leases: map[int]driver.Lease{}, relays: map[string]driver.RelayRecord{}}
	now := epoch
	for range 10 {
		now = now.Add(testRI)
		for _, id := range ids {
			m.relays[id] = driver.RelayRecord{ID: id, LastSeen: now}
		}
		view := m.view()
		for _, id := range ids {
			m.apply(id, planRound(view, id, now, params(n)), now)
		}
	}
	require.Zero(t, m.refused)
	return m, now
}

// stopViews lists every view a peer can read while relay s stops gracefully: before
// its stop stamp, after it, after every subset of its releases that concurrent
// writes can leave (all of them when s holds few buckets; otherwise every prefix in
// ascending and descending order and random subsets), and after the last release.
func stopViews(m *model, s string, at time.Time, rng *rand.Rand) []driver.Coordination {
	before := m.view()
	stamped := &model{n: m.n, leases: maps(m.leases), relays: map[string]driver.RelayRecord{}}
	for id, r := range m.relays {
		stamped.relays[id] = r
	}
	stamped.relays[s] = driver.RelayRecord{ID: s, LastSeen: at, StoppedAt: at}
	var held []int
	for b := range m.n {
		if l, ok := m.leases[b]; ok && l.Owner == s {
			held = append(held, b)
		}
	}
	releasing := func(bs []int) driver.Coordination {
		c := &model{n: m.n, leases: maps(stamped.leases), relays: stamped.relays}
		for _, b := range bs {
			c.leases[b] = driver.Lease{Bucket: b, ExpiresAt: c.leases[b].ExpiresAt}
		}
		return c.view()
	}
	views := []driver.Coordination{before}
	if len(held) <= 6 {
		for mask := range 1 << len(held) {
			var bs []int
			for i, b := range held {
				if mask&(1<<i) != 0 {
					bs = append(bs, b)
				}
			}
			views = append(views, releasing(bs))
		}
		return views
	}
	for i := range len(held) + 1 {
		views = append(views, releasing(held[:i]), releasing(held[len(held)-i:]))
	}
	for range 16 {
		var bs []int
		for _, b := range held {
			if rng.IntN(2) == 0 {
				bs = append(bs, b)
			}
		}
		views = append(views, releasing(bs))
	}
	return views
}

// stopConflicts enumerates, for a fleet of k relays settled on n buckets, every relay
// stopping gracefully and every view its peers can read meanwhile (see stopViews),
// read at the stop and just before the stop hold ends. It counts the plans made and
// the claims that would be refused: two peers claiming one bucket, or a claim of a
// bucket the stopping relay still holds.
func stopConflicts(t *testing.T, n, k int, pp planParams, rng *rand.Rand) (plans, conflicts int) {
	var ids []string
	for i := range k {
		ids = append(ids, fmt.Sprintf("r%d", i))
	}
	m, now := settled(t, n, ids)
	for _, s := range ids {
		stopAt := now.Add(time.Millisecond)
		claimedBy := make(map[int]string)
		for _, view := range stopViews(m, s, stopAt, rng) {
			for _, id := range ids {
				if id == s {
					continue
				}
				for _, at := range []time.Time{stopAt, stopAt.Add(testRI - time.Microsecond)} {
					plans++
					for _, b := range planRound(view, id, at, pp).Claim {
						l, _ := leaseOf(view, b)
						if prev, ok := claimedBy[b]; (ok && prev != id) || l.Owner == s {
							conflicts++
						}
						claimedBy[b] = id
					}
				}
			}
		}
	}
	return plans, conflicts
}

// TestPlanGracefulStopMakesNoRefusedClaim enumerates, for every bucket count from 1
// to 64 and fleets of 2 to 8 relays in steady state, every relay stopping gracefully
// and every view its peers can read while it stamps itself stopped and releases its
// leases (in any order, or at once), read at any moment within the stop hold: no two
// peers plan to claim the same bucket, and nobody claims a bucket the stopping relay
// still holds. So a graceful stop causes no refused write. Without the hold the same
// enumeration finds refused claims, so the check can fail.
func TestPlanGracefulStopMakesNoRefusedClaim(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(11, 11))
	total := 0
	for n := 1; n <= 64; n++ {
		for k := 2; k <= 8; k++ {
			plans, conflicts := stopConflicts(t, n, k, params(n), rng)
			require.Zero(t, conflicts, "%d buckets, %d relays: refused claims during a graceful stop", n, k)
			total += plans
		}
	}
	t.Logf("%d plans checked, no refused claim", total)

	without := 0
	for n := 1; n <= 16; n++ {
		for k := 2; k <= 8; k++ {
			pp := params(n)
			pp.StopHold = 0
			_, conflicts := stopConflicts(t, n, k, pp, rng)
			without += conflicts
		}
	}
	require.Positive(t, without, "without the stop hold, some views must conflict")
	t.Logf("without the stop hold: %d refused claims up to 16 buckets", without)
}
