package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// inFlight measures how many lease writes run at once.
type inFlight struct {
	memDriver
	mu       sync.Mutex
	now, max int
}

func (s *inFlight) write() func() {
	s.mu.Lock()
	s.now++
	s.max = max(s.max, s.now)
	s.mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	return func() {
		s.mu.Lock()
		s.now--
		s.mu.Unlock()
	}
}

func (s *inFlight) Claim(ctx context.Context, bucket int, owner string, now, exp time.Time) (bool, error) {
	defer s.write()()
	return s.memDriver.Claim(ctx, bucket, owner, now, exp)
}

func (s *inFlight) Renew(ctx context.Context, held driver.Lease, now, exp time.Time) (bool, error) {
	defer s.write()()
	return s.memDriver.Renew(ctx, held, now, exp)
}

func (s *inFlight) Driver() driver.Store { return s }

func TestLeaseWritesRunConcurrently(t *testing.T) {
	t.Parallel()
	f := newFleet(t, 16)
	store := &inFlight{memDriver: relaySide(f.store)}
	cfg := Config{RelayID: "a", LeaseDuration: testLD, LeaseRenewInterval: testRI, MaxConcurrency: 4,
		Logger: quietLogger(), Now: f.clock.Now}
	a, err := New(store, outboxtest.NewRecorder(), cfg)
	require.NoError(t, err)
	_, err = a.coord.coordinate(context.Background())
	require.NoError(t, err)
	require.Len(t, a.Owned(), 16)
	require.Equal(t, 4, store.max, "16 claims run MaxConcurrency at a time")
	f.clock.Advance(testRI)
	store.max = 0
	_, err = a.coord.coordinate(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, store.max, "16 renewals run MaxConcurrency at a time")
}

// crashAfter makes relay "a" die after its n-th store write of a round: the write
// and every later call of "a" fail.
type crashAfter struct {
	memDriver
	mu        sync.Mutex
	n, writes int
	dead      bool
}

var errCrashed = errors.New("crashed")

func (c *crashAfter) write(owner string) error {
	if owner != "a" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead || c.writes >= c.n {
		c.dead = true
		return errCrashed
	}
	c.writes++
	return nil
}

func (c *crashAfter) Heartbeat(ctx context.Context, relay string, at time.Time, n int, instance driver.Instance) (bool, error) {
	if err := c.write(relay); err != nil {
		return false, err
	}
	return c.memDriver.Heartbeat(ctx, relay, at, n, instance)
}

func (c *crashAfter) Renew(ctx context.Context, held driver.Lease, now, exp time.Time) (bool, error) {
	if err := c.write(held.Owner); err != nil {
		return false, err
	}
	return c.memDriver.Renew(ctx, held, now, exp)
}

func (c *crashAfter) Driver() driver.Store { return c }

// A relay that dies at any point of a round (before, between or after its renewals,
// before or after its heartbeat) loses each bucket to a peer within 1.05 ×
// LeaseDuration of that bucket's last renewal: its heartbeat lapses no later than its
// leases, and the peer re-plans just after a lapse instead of at its next round.
func TestCrashAtAnyPointOfARoundHandsOverWithinTheLease(t *testing.T) {
	t.Parallel()
	const renewals = 4 // "a" holds 4 of 8 buckets: 4 renewals, then the heartbeat
	for n := 0; n <= renewals+1; n++ {
		t.Run(fmt.Sprintf("dies after %d writes", n), func(t *testing.T) {
			f := newFleet(t, 8)
			crash := &crashAfter{memDriver: relaySide(f.store), n: 1 << 30}
			mk := func(id string) *Relay {
				d, err := New(crash, outboxtest.NewRecorder(), Config{RelayID: id, LeaseDuration: testLD,
					LeaseRenewInterval: testRI, Logger: quietLogger(), Now: f.clock.Now})
				require.NoError(t, err)
				return d
			}
			a, b := mk("a"), mk("b")
			ctx := context.Background()
			for range 4 {
				for _, d := range []*Relay{a, b} {
					_, err := d.coord.coordinate(ctx)
					require.NoError(t, err)
				}
				f.clock.Advance(testRI)
			}
			require.Len(t, a.Owned(), 4)

			crash.mu.Lock()
			crash.n, crash.writes = n, 0
			crash.mu.Unlock()
			_, err := a.coord.coordinate(ctx)
			if n <= renewals {
				require.ErrorIs(t, err, errCrashed)
			} else {
				require.NoError(t, err, "dies right after its heartbeat")
			}
			view, err := f.store.Driver().ReadCoordination(ctx)
			require.NoError(t, err)
			deadline := map[int]time.Time{}
			for _, l := range view.Leases {
				if l.Owner == "a" {
					deadline[l.Bucket] = l.ExpiresAt.Add(testLD / 20) // last renewal + 1.05 × LeaseDuration
				}
			}

			// b runs its rounds half a renew interval out of step with a's, when its
			// loop would (lapse rounds included), until it holds everything.
			f.clock.Advance(testRI / 2)
			for len(b.Owned()) < 8 {
				plan, err := b.coord.coordinate(ctx)
				require.NoError(t, err)
				for _, bk := range b.Owned() {
					if dl, ok := deadline[bk]; ok {
						require.False(t, f.clock.Now().After(dl), "bucket %d taken over at %s, after %s", bk, f.clock.Now(), dl)
						delete(deadline, bk)
					}
				}
				require.Less(t, f.clock.Now().Sub(epoch), 10*testLD, "b never took everything")
				f.clock.Advance(b.coord.roundDelay(plan))
			}
			require.Empty(t, deadline)
		})
	}
}
