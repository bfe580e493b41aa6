package relay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// slowClaims is a relay's view of a store behind a slow link: its claims never finish
// within the relay's StoreTimeout, everything else works.
type slowClaims struct {
	memDriver
}

func (s slowClaims) Driver() driver.Store { return s }

func (s slowClaims) Claim(ctx context.Context, bucket int, owner string, now, expiresAt time.Time) (bool, error) {
	<-ctx.Done() // the relay's store-call deadline
	return false, ctx.Err()
}

// A relay whose claims keep timing out gives its share to its peers: without that it
// stays in the plan (its heartbeats succeed), its peers leave its share to it, and the
// messages of those buckets are never published.
func TestRelayWhoseClaimsTimeOutGivesWay(t *testing.T) {
	ctx := context.Background()
	store := newStore(t, 8)
	cfg := func(id string) Config {
		c := workerConfig(id)
		c.LeaseDuration, c.LeaseRenewInterval = time.Second, 300*time.Millisecond
		c.StoreTimeout = 50 * time.Millisecond
		return c
	}
	slow := newDispatcher(t, slowClaims{relaySide(store)}, outboxtest.NewRecorder(), cfg("a-slow"))
	rec := outboxtest.NewRecorder()
	healthy := newDispatcher(t, store, rec, cfg("b-healthy"))
	require.NoError(t, slow.Start(ctx))
	t.Cleanup(slow.Kill)
	require.NoError(t, healthy.Start(ctx))
	t.Cleanup(healthy.Kill)

	envs := enqueue(t, store, nil, 64) // no key: spread over every bucket
	buckets := map[int]bool{}
	for _, e := range envs {
		buckets[e.Bucket] = true
	}
	require.Greater(t, len(buckets), 4, "the messages fall in both relays' shares")
	// Derived from the work: a few rounds and a give-way of one lease.
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, rec.WaitForUnique(wait, len(envs)), "every message is published by the healthy relay")
	require.Empty(t, slow.Owned(), "the slow relay holds nothing")
}

func TestStoreTimeoutIsValidated(t *testing.T) {
	require.ErrorContains(t, Config{StoreTimeout: -time.Second}.Validate(), "StoreTimeout")
	require.ErrorContains(t, Config{StoreTimeout: time.Minute}.Validate(), "at most LeaseDuration")
	require.NoError(t, Config{StoreTimeout: 20 * time.Second}.Validate())
	require.Equal(t, DefaultLeaseRenewInterval, Config{}.withDefaults().StoreTimeout)
}
