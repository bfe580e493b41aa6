package relay

import (
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// planParams are the settings every relay of a fleetView must share for their plans to
// agree.
type planParams struct {
	// BucketCount is the number of buckets to divide.
	BucketCount int
	// LeaseDuration is how long a lease and a heartbeat stay valid: a relay counts
	// towards fair share while its heartbeat is younger than this.
	LeaseDuration time.Duration
	// StopHold is how long after a relay stamped itself stopped its peers claim
	// nothing while it still holds a valid lease: see planRound.
	StopHold time.Duration
}

// leasePlan is one relay's part of a coordination round, computed by planRound.
type leasePlan struct {
	// Renew lists the leases the relay holds and keeps; it extends each under the
	// expiry it read.
	Renew []driver.Lease
	// Hold lists leases the relay holds and keeps but cannot renew, because its clock
	// is behind their stored expiry (a renewal would move the expiry backwards). It
	// publishes nothing from them until its clock passes the stored expiry.
	Hold []driver.Lease
	// Release lists the leases the relay hands back because it holds more than its
	// share, buckets outside its assigned range first.
	Release []driver.Lease
	// Claim lists the free buckets the relay takes, in bucket order.
	Claim []int
	// Share is the relay's fair share of the buckets.
	Share int
	// RangeStart and RangeEnd bound the relay's assigned range [RangeStart, RangeEnd).
	RangeStart, RangeEnd int
	// Active is the number of relays counted towards fair share.
	Active int
	// Standby reports that the relay is active but has no share: relays outnumber
	// buckets. StandbyRank is its position among the standbys (0 first), or -1.
	Standby     bool
	StandbyRank int
	// ClockBehind reports that the relay's stored heartbeat is later than its clock:
	// its heartbeat is refused and it claims nothing.
	ClockBehind bool
	// Unsettled reports that the fleetView is moving buckets: a free bucket waits for a
	// relay still short of its share, a relay holds more than its share, or a relay
	// that is stopping still holds leases. The relay then re-plans soon instead of
	// after LeaseRenewInterval.
	Unsettled bool
	// NextChange is the earliest time at which the plan can change by time alone: a
	// peer's lease or heartbeat lapses, or a stopping peer's hold ends. Zero: none.
	NextChange time.Time
	// Mismatch names an active peer that runs with another bucket count, if any.
	Mismatch *driver.RelayRecord
}

// owns reports whether the plan leaves the relay holding bucket after the round, if
// every write succeeds.
func (p leasePlan) owns(bucket int) bool {
	for _, l := range p.Renew {
		if l.Bucket == bucket {
			return true
		}
	}
	for _, l := range p.Hold {
		if l.Bucket == bucket {
			return true
		}
	}
	return slices.Contains(p.Claim, bucket)
}

// planRound computes self's part of a coordination round from one consistent view. It is a
// pure function: relays that read the same view at the same time compute plans whose
// writes are disjoint, so a healthy fleetView makes no refused conditional write.
//
// The fleetView-wide split it derives, and of which it returns self's part:
//
//   - Active relays are those whose heartbeat is younger than LeaseDuration and that
//     have not stamped themselves stopped. A relay that does not see itself active
//     hands everything back and claims nothing.
//   - Each active relay's share is BucketCount/active, and BucketCount%active relays
//     get one more: those holding the most buckets, then in relay-id order, so where
//     the split leaves a choice the current holder keeps its buckets.
//   - Shares are laid out as contiguous ranges in relay-id order.
//   - A relay holding more than its share hands back the excess, buckets outside its
//     range first.
//   - Free buckets (never leased, released, or lapsed) go first to the relay whose
//     range contains them, then to relays still short of their share in relay-id
//     order. Buckets whose lease is still valid but names an inactive relay are left
//     alone until the lease lapses.
//   - While a relay that stamped itself stopped less than StopHold ago still holds a
//     valid lease, nobody claims anything: its releases are under way, and a peer
//     that read between two of them would plan with another set of free buckets than
//     a peer that read after the last. So every claim after a graceful stop is
//     planned on the same view, and no claim is refused.
//   - A relay whose stored heartbeat is later than now (its clock was set back)
//     claims nothing, and does not renew a lease whose expiry is later than
//     now+LeaseDuration.
func planRound(view driver.Coordination, self string, now time.Time, p planParams) leasePlan {
	plan := leasePlan{StandbyRank: -1}
	if p.BucketCount < 1 {
		return plan
	}
	f := fleetView{self: self, now: now, plan: &plan}
	f.readRelays(view.Relays, p)
	f.readLeases(view.Leases, p.BucketCount)
	if !f.selfActive {
		// Not counted by the fleetView (stopping, or never seen): hand everything back.
		plan.Release = f.selfHeld
		return plan
	}
	f.share = fairShares(f.active, f.held, p.BucketCount)
	f.layOut()
	release, deficit, short := f.excess()
	owner := assignFree(f.active, f.ranges, f.free, deficit)
	for _, l := range f.selfHeld {
		switch {
		case release[l.Bucket]:
			plan.Release = append(plan.Release, l)
		case l.ExpiresAt.After(now.Add(p.LeaseDuration)):
			plan.Hold = append(plan.Hold, l)
		default:
			plan.Renew = append(plan.Renew, l)
		}
	}
	if f.stopHold || (short && len(f.free) > 0) {
		plan.Unsettled = true
	}
	if !plan.ClockBehind && !f.stopHold {
		for _, b := range f.free {
			if owner[b] == self {
				plan.Claim = append(plan.Claim, b)
			}
		}
	}
	return plan
}

// fleetView is what planRound reads from one view of the fleet, step by step, into self's plan.
type fleetView struct {
	self string
	now  time.Time
	plan *leasePlan

	// From the relay records (readRelays).
	active     []string // in id order
	selfActive bool
	stopping   map[string]bool // stamped stopped less than StopHold ago
	// From the leases (readLeases).
	held     map[string][]int // valid leases by owner, ascending
	free     []int
	selfHeld []driver.Lease
	stopHold bool // a stopping relay still holds a valid lease
	// The split (fairShares, layOut).
	share  map[string]int
	ranges map[string][2]int
}

// changesAt records t as a time the plan can change by time alone, if it is the
// earliest after now.
func (f *fleetView) changesAt(t time.Time) {
	if t.After(f.now) && (f.plan.NextChange.IsZero() || t.Before(f.plan.NextChange)) {
		f.plan.NextChange = t
	}
}

// readRelays finds the active relays (heartbeat younger than LeaseDuration, not
// stamped stopped), those stopping, self's clock trouble, and a peer with another
// bucket count.
func (f *fleetView) readRelays(relays []driver.RelayRecord, p planParams) {
	f.stopping = make(map[string]bool)
	for _, r := range relays {
		if r.ID == f.self {
			f.plan.ClockBehind = r.LastSeen.After(f.now)
			if f.selfActive = !r.Stopped() && f.now.Sub(r.LastSeen) < p.LeaseDuration; f.selfActive {
				f.active = append(f.active, f.self)
			}
			continue
		}
		if r.Stopped() {
			if f.now.Sub(r.StoppedAt) < p.StopHold {
				f.stopping[r.ID] = true
				f.changesAt(r.StoppedAt.Add(p.StopHold))
			}
			continue
		}
		if f.now.Sub(r.LastSeen) >= p.LeaseDuration {
			continue
		}
		f.changesAt(r.LastSeen.Add(p.LeaseDuration))
		f.active = append(f.active, r.ID)
		if r.BucketCount != 0 && r.BucketCount != p.BucketCount && f.plan.Mismatch == nil {
			f.plan.Mismatch = &r
		}
	}
	slices.Sort(f.active)
	f.plan.Active = len(f.active)
}

// readLeases finds, per bucket, who validly holds it, and which buckets are free.
func (f *fleetView) readLeases(leases []driver.Lease, n int) {
	byBucket := make([]driver.Lease, n)
	leased := make([]bool, n)
	for _, l := range leases {
		if l.Bucket < 0 || l.Bucket >= n {
			continue
		}
		byBucket[l.Bucket] = l
		leased[l.Bucket] = true
	}
	f.held = make(map[string][]int, len(f.active))
	for b := range n {
		l := byBucket[b]
		if !leased[b] || l.Free(f.now) {
			f.free = append(f.free, b)
			continue
		}
		f.held[l.Owner] = append(f.held[l.Owner], b)
		if l.Owner == f.self {
			f.selfHeld = append(f.selfHeld, l)
		} else {
			f.changesAt(l.ExpiresAt)
		}
		f.stopHold = f.stopHold || f.stopping[l.Owner]
	}
}

// fairShares gives each active relay n/len(active) buckets; the n%len(active) extra
// buckets go to the relays holding the most, then in id order, so where the split
// leaves a choice the current holder keeps its buckets.
func fairShares(active []string, held map[string][]int, n int) map[string]int {
	k := len(active)
	base, extra := n/k, n%k
	byHoldings := slices.Clone(active)
	slices.SortStableFunc(byHoldings, func(a, b string) int {
		if d := len(held[b]) - len(held[a]); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	share := make(map[string]int, k)
	for i, id := range byHoldings {
		share[id] = base
		if i < extra {
			share[id]++
		}
	}
	return share
}

// layOut lays the shares out as contiguous ranges in relay-id order, and ranks the
// relays without a share as standbys.
func (f *fleetView) layOut() {
	f.ranges = make(map[string][2]int, len(f.active))
	start, standby := 0, 0
	for _, id := range f.active {
		f.ranges[id] = [2]int{start, start + f.share[id]}
		start += f.share[id]
		if f.share[id] == 0 {
			if id == f.self {
				f.plan.Standby = true
				f.plan.StandbyRank = standby
			}
			standby++
		}
	}
	f.plan.Share = f.share[f.self]
	f.plan.RangeStart, f.plan.RangeEnd = f.ranges[f.self][0], f.ranges[f.self][1]
}

// excess works out what each relay keeps after handing back what it holds above its
// share: the buckets self hands back, how many each relay is short, and whether any
// is.
func (f *fleetView) excess() (release map[int]bool, deficit map[string]int, short bool) {
	deficit = make(map[string]int, len(f.active))
	for _, id := range f.active {
		hs := f.held[id]
		over := len(hs) - f.share[id]
		if over <= 0 {
			deficit[id] = -over
			short = short || over < 0
			continue
		}
		f.plan.Unsettled = true
		if id == f.self {
			release = make(map[int]bool, over)
			for _, b := range handBack(hs, f.ranges[id], over) {
				release[b] = true
			}
		}
	}
	return release, deficit, short
}

// assignFree gives the free buckets to the relays short of their share: each its own
// range first, then whoever is still short, in id order.
func assignFree(active []string, ranges map[string][2]int, free []int, deficit map[string]int) map[int]string {
	owner := make(map[int]string, len(free))
	for _, id := range active {
		r := ranges[id]
		for _, b := range free {
			if deficit[id] == 0 {
				break
			}
			if b >= r[0] && b < r[1] {
				owner[b] = id
				deficit[id]--
			}
		}
	}
	for _, id := range active {
		for _, b := range free {
			if deficit[id] == 0 {
				break
			}
			if _, taken := owner[b]; !taken {
				owner[b] = id
				deficit[id]--
			}
		}
	}
	return owner
}

// handBack picks excess buckets of held (ascending) to release: outside the range
// first, farthest from it first, then the top of the range.
func handBack(held []int, rng [2]int, excess int) []int {
	var outside, inside []int
	for _, b := range held {
		if b >= rng[0] && b < rng[1] {
			inside = append(inside, b)
		} else {
			outside = append(outside, b)
		}
	}
	dist := func(b int) int {
		if b < rng[0] {
			return rng[0] - b
		}
		return b - rng[1] + 1
	}
	slices.SortStableFunc(outside, func(a, b int) int {
		if d := dist(b) - dist(a); d != 0 {
			return d
		}
		return a - b
	})
	slices.Reverse(inside)
	order := append(outside, inside...)
	return order[:excess]
}
