package relay

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

var errBroker = errors.New("broker unavailable")

func TestRunOnceDrainsAndReleases(t *testing.T) {
	t.Parallel()
	ctx, _, store, rec, d := relay(t, 8, "sweeper", nil)

	enqueue(t, store, []byte("a"), 30)
	enqueue(t, store, []byte("b"), 30)
	enqueue(t, store, nil, 40)

	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 100, res.Published)
	require.Equal(t, 8, res.Buckets, "a lone relay takes every bucket")
	require.Equal(t, 100, rec.Unique())
	require.Zero(t, rec.Duplicates())
	require.Zero(t, pending(t, store))
	requireKeyOrder(t, rec)

	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "RunOnce releases every lease")
	}
	require.Len(t, view.Relays, 1)
	require.True(t, view.Relays[0].Stopped(), "RunOnce stamps the relay stopped")
	require.Zero(t, d.Stats().RefusedWrites)
}

func TestBatchesAreOnePublishAndOneComplete(t *testing.T) {
	t.Parallel()
	c := newClock()
	store := newStore(t, 1)
	rec := outboxtest.NewRecorder()
	cfg := testConfig(c, "r")
	cfg.BatchSize = 50
	d := newDispatcher(t, store, rec, cfg)
	for i := range 100 {
		enqueue(t, store, []byte{byte(i)}, 1)
	}
	_, err := d.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 100, rec.Len())
	require.Equal(t, 2, rec.Batches(), "distinct keys: one Publish per batch of 50")
}

// countingCompletes counts Complete calls and the envelopes they carry.
type countingCompletes struct {
	memDriver
	mu        sync.Mutex
	calls     int
	envelopes int
}

func (c *countingCompletes) Complete(ctx context.Context, envs []*driver.Envelope) error {
	c.mu.Lock()
	c.calls++
	c.envelopes += len(envs)
	c.mu.Unlock()
	return c.memDriver.Complete(ctx, envs)
}

func (c *countingCompletes) Driver() driver.Store { return c }

// Waves of one key's messages (a transport that does not keep key order gets at most
// one message per key per Publish) still cost one Complete per drain pass.
func TestWavesShareOneCompletePerPass(t *testing.T) {
	t.Parallel()
	c := newClock()
	mem := newStore(t, 1)
	store := &countingCompletes{memDriver: relaySide(mem)}
	rec := outboxtest.NewRecorder()
	d := newDispatcher(t, store, rec, testConfig(c, "r"))
	for _, key := range []string{"a", "b", "c"} {
		enqueue(t, store, []byte(key), 4) // four waves
	}
	res, err := d.RunOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, 12, res.Published)
	require.Equal(t, 4, rec.Batches(), "one Publish per wave")
	requireKeyOrder(t, rec)
	require.Equal(t, 1, store.calls, "one Complete for the whole pass")
	require.Equal(t, 12, store.envelopes)
	require.Zero(t, pending(t, mem))
}

func TestPerKeyOrderHoldsUnderFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	store := newStore(t, 1) // one bucket: every key shares it
	rec := outboxtest.NewRecorder()
	d := newDispatcher(t, store, rec, testConfig(c, "r"))

	a := enqueue(t, store, []byte("a"), 3)
	b := enqueue(t, store, []byte("b"), 3)
	rec.FailID(a[0].ID, errBroker, 1)

	_, err := d.RunOnce(ctx)
	require.NoError(t, err)
	got := rec.ByKey()
	require.Empty(t, got["a"], "a's later messages wait for its failed head")
	require.Equal(t, idsOf(b), idsOf(got["b"]), "the failure does not block other keys")

	env, err := find(ctx, store, a[0].ID)
	require.NoError(t, err)
	require.Equal(t, 1, env.Attempts)
	require.Equal(t, errBroker.Error(), env.LastError)

	c.Advance(time.Second) // the first backoff
	_, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, idsOf(a), idsOf(rec.ByKey()["a"]))
	require.Zero(t, pending(t, store))
}

func TestPerKeyOrderUnderRandomFailures(t *testing.T) {
	t.Parallel()
	for seed := range uint64(5) {
		ctx := context.Background()
		c := newClock()
		store := newStore(t, 4)
		rec := outboxtest.NewRecorder()
		cfg := testConfig(c, "r")
		cfg.MaxAttempts = 1000
		cfg.BatchSize = 16
		d := newDispatcher(t, store, rec, cfg)
		rng := rand.New(rand.NewPCG(seed, 7))
		rec.FailWhen(func(*driver.Envelope) error { // runs under the Recorder's lock
			if rng.IntN(3) == 0 {
				return errBroker
			}
			return nil
		})
		for i := range 200 {
			enqueue(t, store, []byte{byte('a' + i%7)}, 1)
			if i%5 == 0 {
				enqueue(t, store, nil, 1)
			}
		}
		for range 200 {
			if pending(t, store) == 0 {
				break
			}
			_, err := d.RunOnce(ctx)
			require.NoError(t, err)
			c.Advance(time.Minute)
		}
		require.Zero(t, pending(t, store), "seed %d", seed)
		require.Equal(t, 240, rec.Unique(), "seed %d", seed)
		requireKeyOrder(t, rec)
		require.Zero(t, d.Stats().OutOfOrder)
	}
}

func TestParkAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	ctx, c, store, rec, d := relay(t, 1, "r", func(cfg *Config) {
		cfg.MaxAttempts = 3
	})

	a := enqueue(t, store, []byte("a"), 2)
	rec.FailID(a[0].ID, errBroker, -1)
	for i := range 3 {
		res, err := d.RunOnce(ctx)
		require.NoError(t, err)
		if i < 2 {
			require.Equal(t, 1, res.Retried)
			require.Zero(t, rec.Len(), "the key is held while its head retries")
		} else {
			require.Equal(t, 1, res.Parked)
		}
		c.Advance(time.Hour)
	}
	env, err := find(ctx, store, a[0].ID)
	require.NoError(t, err)
	require.Equal(t, driver.Parked, env.Status)
	require.Equal(t, 3, env.Attempts)
	require.EqualValues(t, 1, d.Stats().Parked)

	// A parked message no longer holds its key.
	_, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{a[1].ID.String()}, idsOf(rec.Messages()))
}

func TestPermanentFailureParksAtOnce(t *testing.T) {
	t.Parallel()
	ctx, _, store, rec, d := relay(t, 1, "r", nil)

	a := enqueue(t, store, []byte("a"), 2)
	rec.FailID(a[0].ID, driver.Permanent(errors.New("message too large")), -1)
	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.Parked)
	require.Zero(t, res.Retried)
	env, err := find(ctx, store, a[0].ID)
	require.NoError(t, err)
	require.Equal(t, driver.Parked, env.Status)
	require.Equal(t, 1, env.Attempts)
	require.Contains(t, env.LastError, "too large")
}

func TestWholeBatchErrorRetriesEveryMessage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	store := newStore(t, 1)
	rec := outboxtest.NewRecorder()
	ft, err := outboxtest.NewFaultTransport(rec, outboxtest.Faults{})
	require.NoError(t, err)
	d := newDispatcher(t, store, ft, testConfig(c, "r"))
	enqueue(t, store, nil, 5)

	ft.SetDown(true)
	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, res.Retried)
	require.Zero(t, rec.Len())

	ft.SetDown(false)
	c.Advance(time.Second)
	res, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, res.Published)
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	c := newClock()
	store := newStore(t, 1)
	cfg := testConfig(c, "r")
	cfg.BackoffBase = time.Second
	cfg.BackoffMax = 10 * time.Second
	d := newDispatcher(t, store, outboxtest.NewRecorder(), cfg)
	var got []time.Duration
	for n := 1; n <= 7; n++ {
		got = append(got, d.cfg.backoff(n))
	}
	require.Equal(t, []time.Duration{1e9, 2e9, 4e9, 8e9, 10e9, 10e9, 10e9}, got)
	require.Equal(t, 10*time.Second, d.cfg.backoff(1000), "no overflow for large attempt counts")

	cfg.Jitter = 0.5
	dj := newDispatcher(t, store, outboxtest.NewRecorder(), cfg)
	for n := 1; n <= 6; n++ {
		full := d.cfg.backoff(n)
		for range 100 {
			j := dj.cfg.backoff(n)
			require.LessOrEqual(t, j, full)
			require.GreaterOrEqual(t, j, full/2)
		}
	}

	// Stored: the second failure waits twice as long as the first.
	ctx := context.Background()
	rec := outboxtest.NewRecorder()
	ds := newDispatcher(t, store, rec, testConfig(c, "r2"))
	a := enqueue(t, store, []byte("a"), 1)
	rec.FailID(a[0].ID, errBroker, -1)
	for attempt, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		start := c.Now()
		_, err := ds.RunOnce(ctx)
		require.NoError(t, err)
		env, err := find(ctx, store, a[0].ID)
		require.NoError(t, err)
		require.Equal(t, attempt+1, env.Attempts)
		require.Equal(t, start.Add(want), env.NextAttemptAt, "attempt %d", attempt+1)
		c.Advance(want)
	}
}

func TestRetentionKeepsThenCleans(t *testing.T) {
	t.Parallel()
	ctx, c, store, rec, d := relay(t, 4, "r", func(cfg *Config) {
		cfg.Retention = time.Hour
	})
	envs := enqueue(t, store, nil, 20)

	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, res.Published)
	for _, e := range envs {
		got, err := find(ctx, store, e.ID)
		require.NoError(t, err)
		require.Equal(t, driver.Dispatched, got.Status)
		require.Equal(t, epoch, got.DispatchedAt)
	}
	require.Zero(t, pending(t, store))

	c.Advance(30 * time.Minute)
	res, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Deleted, "kept for the retention period")

	c.Advance(31 * time.Minute)
	res, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 20, res.Deleted)
	for _, e := range envs {
		_, err := find(ctx, store, e.ID)
		require.ErrorIs(t, err, driver.ErrNotFound)
	}
	require.Equal(t, 20, rec.Len(), "nothing published twice")
}

// noRetainer hides every optional capability of a store.
type noRetainer struct{ driver.Store }

func (s noRetainer) Driver() driver.Store { return s }

func TestRetentionNeedsARetainer(t *testing.T) {
	t.Parallel()
	store := newStore(t, 8)
	_, err := New(noRetainer{store.Driver()}, outboxtest.NewRecorder(), Config{Retention: time.Hour, Logger: quietLogger()})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Retention")
}

func TestUnorderedDoesNotHoldTheKey(t *testing.T) {
	t.Parallel()
	ctx, c, store, rec, d := relay(t, 1, "r", func(cfg *Config) {
		cfg.Unordered = true
	})
	a := enqueue(t, store, []byte("a"), 3)
	rec.FailID(a[0].ID, errBroker, 1)

	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.Published)
	require.Equal(t, 1, rec.Batches(), "unordered: one key's messages share a batch")
	c.Advance(time.Second)
	_, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{a[1].ID.String(), a[2].ID.String(), a[0].ID.String()}, idsOf(rec.Messages()))
}

func TestSameKeyMessagesGoOutInWaves(t *testing.T) {
	t.Parallel()
	ctx, _, store, rec, d := relay(t, 1, "r", nil)
	a := enqueue(t, store, []byte("a"), 3)
	b := enqueue(t, store, []byte("b"), 1)
	rec.FailID(a[1].ID, errBroker, 1)

	_, err := d.RunOnce(ctx)
	require.NoError(t, err)
	// Wave 1: a0, b0. Wave 2: a1 fails, so a2 is held.
	require.Equal(t, []string{a[0].ID.String(), b[0].ID.String()}, idsOf(rec.Messages()))
	require.Equal(t, 2, rec.Batches())
}

func TestKeylessMessagesNeverBlockEachOther(t *testing.T) {
	t.Parallel()
	ctx, _, store, rec, d := relay(t, 1, "r", nil)
	envs := enqueue(t, store, nil, 5)
	rec.FailID(envs[0].ID, errBroker, 1)
	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, res.Published)
	require.Equal(t, 1, rec.Batches())
}

func TestDispatchOneDrainsTheBucketUpToTheMessage(t *testing.T) {
	t.Parallel()
	ctx, c, store, rec, d := relay(t, 1, "stream", nil)
	a := enqueue(t, store, []byte("a"), 3)
	b := enqueue(t, store, []byte("b"), 1)

	res, err := d.DispatchOne(ctx, a[1].ID)
	require.NoError(t, err)
	require.Equal(t, 2, res.Published)
	require.Equal(t, idsOf(a[:2]), idsOf(rec.Messages()), "earlier messages first, nothing after the target")

	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "the bucket claimed for one dispatch is released")
	}

	// Already published: nothing to do.
	res, err = d.DispatchOne(ctx, a[0].ID)
	require.NoError(t, err)
	require.Zero(t, res.Published)

	// A bucket another relay holds is left to it.
	ok, err := store.Driver().Claim(ctx, 0, "owner", c.Now(), c.Now().Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	res, err = d.DispatchOne(ctx, b[0].ID)
	require.NoError(t, err)
	require.Zero(t, res.Published)
	require.Equal(t, 2, rec.Len())

	res, err = d.DispatchOne(ctx, [16]byte{1})
	require.NoError(t, err, "an unknown id was published and deleted already")
	require.Zero(t, res.Published)

	dn := newDispatcher(t, noRetainer{store.Driver()}, rec, testConfig(c, "x"))
	_, err = dn.DispatchOne(ctx, a[2].ID)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	store := newStore(t, 8)
	rec := outboxtest.NewRecorder()
	cases := map[string]Config{
		"BucketCount":        {BucketCount: -1},
		"BatchSize":          {BatchSize: -1},
		"PollInterval":       {PollInterval: -time.Second},
		"LeaseRenewInterval": {LeaseDuration: 30 * time.Second, LeaseRenewInterval: 15 * time.Second},
		"MaxAttempts":        {MaxAttempts: -2},
		"BackoffMax":         {BackoffBase: time.Minute, BackoffMax: time.Second},
		"Jitter":             {Jitter: 1.5},
		"Retention":          {Retention: -time.Second},
		"MaxConcurrency":     {MaxConcurrency: -1},
	}
	for field, cfg := range cases {
		cfg.Logger = quietLogger()
		err := cfg.Validate()
		require.ErrorIs(t, err, outbox.ErrMisconfigured, field)
		require.ErrorContains(t, err, "Config."+field, "the error names the field")
		_, err = New(store, rec, cfg)
		require.ErrorIs(t, err, outbox.ErrMisconfigured, field)
		require.ErrorContains(t, err, "Config."+field)
	}
	require.NoError(t, Config{}.Validate(), "zero fields take their defaults")
	require.NoError(t, Config{LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second}.Validate())
	err := Config{LeaseDuration: 3 * time.Second}.Validate()
	require.ErrorContains(t, err, "Config.LeaseRenewInterval is 10s", "a default that no longer fits is named")
	d, err := New(store, rec, Config{})
	require.NoError(t, err, "the zero config is valid")
	require.NotEmpty(t, d.RelayID())
	require.Equal(t, DefaultBatchSize, d.cfg.BatchSize)
	require.Equal(t, DefaultLeaseDuration, d.cfg.LeaseDuration)
	_, err = New(nil, rec, Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
}

func TestBucketCountComesFromTheStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := newStore(t, 3)
	enqueue(t, store, nil, 30)
	d, err := New(store, outboxtest.NewRecorder(), Config{Logger: quietLogger()})
	require.NoError(t, err)
	require.Equal(t, 3, d.cfg.BucketCount)
	res, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Buckets, "a lone relay takes every one of the store's buckets")
	require.Equal(t, 30, res.Published)

	_, err = New(store, outboxtest.NewRecorder(), Config{BucketCount: 3, Logger: quietLogger()})
	require.NoError(t, err, "the store's own count is accepted")
}

func TestBucketCountOtherThanTheStoresIsMisconfigured(t *testing.T) {
	t.Parallel()
	store := newStore(t, 8)
	_, err := New(store, outboxtest.NewRecorder(), Config{BucketCount: 16, Logger: quietLogger()})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Config.BucketCount is 16 but the store has 8 buckets")
	require.ErrorContains(t, err, "leave BucketCount 0", "the error says how to fix it")
	require.NoError(t, Config{BucketCount: 16}.Validate(), "only New, which sees the store, can tell")
}

// Through a transport that keeps key order, a key's messages share one Publish call
// and fail together; only the first failure is an attempt, so the ones it held back
// neither burn attempts nor wait out a backoff of their own.
func TestHeldBackMessagesCostNoAttempts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newClock()
	store := newStore(t, 1)
	rec := outboxtest.NewRecorder()
	cfg := testConfig(c, "r")
	cfg.MaxAttempts = 2
	d := newDispatcher(t, store, keyOrdered{rec}, cfg)

	a := enqueue(t, store, []byte("a"), 3)
	for _, e := range a {
		rec.FailID(e.ID, errBroker, 1) // the broker fails the key's whole tail once
	}
	_, err := d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, rec.Batches(), "the key's messages went out in one call")
	for i, e := range a {
		env, err := find(ctx, store, e.ID)
		require.NoError(t, err)
		require.Equal(t, driver.Pending, env.Status)
		if i == 0 {
			require.Equal(t, 1, env.Attempts, "the head's failure is an attempt")
		} else {
			require.Zero(t, env.Attempts, "message %d was only held back", i)
			require.True(t, env.Due(c.Now()), "message %d waits for no backoff of its own", i)
		}
	}

	c.Advance(time.Second) // the head's backoff
	_, err = d.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, idsOf(a), idsOf(rec.ByKey()["a"]), "in order, none parked")
	require.Zero(t, d.Stats().Parked)
}

// relay builds one relay on the fake clock over a fresh memory store with buckets
// buckets, publishing to a Recorder; tune adjusts its test config.
func relay(t *testing.T, buckets int, id string, tune func(*Config)) (context.Context, *clock, *memstore.Store, *outboxtest.Recorder, *Relay) {
	t.Helper()
	c := newClock()
	store := newStore(t, buckets)
	rec := outboxtest.NewRecorder()
	cfg := testConfig(c, id)
	if tune != nil {
		tune(&cfg)
	}
	return context.Background(), c, store, rec, newDispatcher(t, store, rec, cfg)
}
