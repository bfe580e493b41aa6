package relay

import (
	"context"
	"slices"
	"time"

	"sync"

	"github.com/outboxkit/outbox/driver"
)

// leaseTable is what every service of the relay asks before it touches a bucket: the
// leases this relay holds, as stored, the buckets it is handing back, and one lock
// per bucket that serialises draining it (worker, RunOnce, DispatchOne) and releasing
// its lease.
type leaseTable struct {
	margin time.Duration // see Config.margin

	mu      sync.Mutex
	leases  map[int]driver.Lease
	handing map[int]bool // publish nothing new; released once the drain in flight ends
	locks   []chan struct{}
}

func newLeaseTable(buckets int, margin time.Duration) *leaseTable {
	t := &leaseTable{
		margin:  margin,
		leases:  make(map[int]driver.Lease),
		handing: make(map[int]bool),
		locks:   make([]chan struct{}, buckets),
	}
	for i := range t.locks {
		t.locks[i] = make(chan struct{}, 1)
	}
	return t
}

func (t *leaseTable) valid(l driver.Lease, now time.Time) bool {
	return now.Before(l.ExpiresAt.Add(-t.margin))
}

// owned returns, in order, the buckets whose lease covers a publish starting at now.
func (t *leaseTable) owned(now time.Time) []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []int
	for b, l := range t.leases {
		if t.valid(l, now) && !t.handing[b] {
			out = append(out, b)
		}
	}
	slices.Sort(out)
	return out
}

// left reports whether bucket's lease covers a publish starting at now, and how long
// the lease has left.
func (t *leaseTable) left(bucket int, now time.Time) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.leases[bucket]
	if !ok || !t.valid(l, now) || t.handing[bucket] {
		return 0, false
	}
	return l.ExpiresAt.Sub(now), true
}

// publishable reports whether bucket's lease covers a publish starting at now.
func (t *leaseTable) publishable(bucket int, now time.Time) bool {
	_, ok := t.left(bucket, now)
	return ok
}

// set records a lease this relay holds.
func (t *leaseTable) set(l driver.Lease) {
	t.mu.Lock()
	t.leases[l.Bucket] = l
	t.mu.Unlock()
}

// forget drops bucket's lease and any hand-back under way.
func (t *leaseTable) forget(bucket int) {
	t.mu.Lock()
	delete(t.leases, bucket)
	delete(t.handing, bucket)
	t.mu.Unlock()
}

// take drops bucket's lease and returns it.
func (t *leaseTable) take(bucket int) (driver.Lease, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.leases[bucket]
	delete(t.leases, bucket)
	return l, ok
}

// handOver marks bucket as being handed back: it publishes nothing new.
func (t *leaseTable) handOver(bucket int) {
	t.mu.Lock()
	t.handing[bucket] = true
	t.mu.Unlock()
}

// keepOnly forgets every lease keep refuses, and every hand-back handing refuses.
func (t *leaseTable) keepOnly(keep func(driver.Lease) bool, handing func(bucket int) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for b, l := range t.leases {
		if !keep(l) {
			delete(t.leases, b)
		}
	}
	for b := range t.handing {
		if !handing(b) {
			delete(t.handing, b)
		}
	}
}

// clear forgets every lease.
func (t *leaseTable) clear() {
	t.mu.Lock()
	clear(t.leases)
	clear(t.handing)
	t.mu.Unlock()
}

// lock takes bucket's drain lock, or gives up when ctx ends.
func (t *leaseTable) lock(ctx context.Context, bucket int) error {
	select {
	case t.locks[bucket] <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryLock takes bucket's drain lock if it is free.
func (t *leaseTable) tryLock(bucket int) bool {
	select {
	case t.locks[bucket] <- struct{}{}:
		return true
	default:
		return false
	}
}

func (t *leaseTable) unlock(bucket int) { <-t.locks[bucket] }

// waitIdle waits until no drain of any bucket is in flight.
func (t *leaseTable) waitIdle(ctx context.Context) error {
	for b := range t.locks {
		if err := t.lock(ctx, b); err != nil {
			return err
		}
		t.unlock(b)
	}
	return nil
}
