package relay

import (
	"slices"
	"strings"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// planParams are the settings every relay of a fleet must share for their plans to
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
	// Unsettled reports that the fleet is moving buckets: a free bucket waits for a
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
// writes are disjoint, so a healthy fleet makes no refused conditional write.
//
// The fleet-wide split it derives, and of which it returns self's part:
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
	n := p.BucketCount
	plan := leasePlan{StandbyRank: -1}
	if n < 1 {
		return plan
	}
	soon := func(t time.Time) {
		if t.After(now) && (plan.NextChange.IsZero() || t.Before(plan.NextChange)) {
			plan.NextChange = t
		}
	}

	var active []string
	selfActive := false
	stopping := make(map[string]bool)
	for _, r := range view.Relays {
		if r.ID == self {
			plan.ClockBehind = r.LastSeen.After(now)
			if selfActive = !r.Stopped() && now.Sub(r.LastSeen) < p.LeaseDuration; selfActive {
				active = append(active, self)
			}
			continue
		}
		if r.Stopped() {
			if now.Sub(r.StoppedAt) < p.StopHold {
				stopping[r.ID] = true
				soon(r.StoppedAt.Add(p.StopHold))
			}
			continue
		}
		if now.Sub(r.LastSeen) >= p.LeaseDuration {
			continue
		}
		soon(r.LastSeen.Add(p.LeaseDuration))
		active = append(active, r.ID)
		if r.BucketCount != 0 && r.BucketCount != n && plan.Mismatch == nil {
			plan.Mismatch = &r
		}
	}
	slices.Sort(active)
	plan.Active = len(active)

	// Per bucket: who validly holds it, and which buckets are free.
	leases := make([]driver.Lease, n)
	leased := make([]bool, n)
	for _, l := range view.Leases {
		if l.Bucket < 0 || l.Bucket >= n {
			continue
		}
		leases[l.Bucket] = l
		leased[l.Bucket] = true
	}
	held := make(map[string][]int, len(active))
	var free []int
	var selfHeld []driver.Lease
	hold := false
	for b := range n {
		l := leases[b]
		if !leased[b] || l.Free(now) {
			free = append(free, b)
			continue
		}
		held[l.Owner] = append(held[l.Owner], b)
		if l.Owner == self {
			selfHeld = append(selfHeld, l)
		} else {
			soon(l.ExpiresAt)
		}
		hold = hold || stopping[l.Owner]
	}

	if !selfActive {
		// Not counted by the fleet (stopping, or never seen): hand everything back.
		plan.Release = selfHeld
		return plan
	}

	// Shares: the extra buckets go to the relays holding the most, then by id.
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

	// Ranges in relay-id order; standby ranks among relays without a share.
	rangeOf := make(map[string][2]int, k)
	start, standby := 0, 0
	for _, id := range active {
		rangeOf[id] = [2]int{start, start + share[id]}
		start += share[id]
		if share[id] == 0 {
			if id == self {
				plan.Standby = true
				plan.StandbyRank = standby
			}
			standby++
		}
	}
	plan.Share = share[self]
	plan.RangeStart, plan.RangeEnd = rangeOf[self][0], rangeOf[self][1]

	// What each relay keeps after handing back its excess.
	deficit := make(map[string]int, k)
	var selfRelease map[int]bool
	short := false
	for _, id := range active {
		hs := held[id]
		excess := len(hs) - share[id]
		if excess <= 0 {
			deficit[id] = -excess
			short = short || excess < 0
			continue
		}
		plan.Unsettled = true
		if id == self {
			selfRelease = make(map[int]bool, excess)
			for _, b := range handBack(hs, rangeOf[id], excess) {
				selfRelease[b] = true
			}
		}
	}

	// Claims: own range first, then whoever is still short, in id order.
	owner := make(map[int]string, len(free))
	for _, id := range active {
		r := rangeOf[id]
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

	for _, l := range selfHeld {
		switch {
		case selfRelease[l.Bucket]:
			plan.Release = append(plan.Release, l)
		case l.ExpiresAt.After(now.Add(p.LeaseDuration)):
			plan.Hold = append(plan.Hold, l)
		default:
			plan.Renew = append(plan.Renew, l)
		}
	}
	if hold || (short && len(free) > 0) {
		plan.Unsettled = true
	}
	if !plan.ClockBehind && !hold {
		for _, b := range free {
			if owner[b] == self {
				plan.Claim = append(plan.Claim, b)
			}
		}
	}
	return plan
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
