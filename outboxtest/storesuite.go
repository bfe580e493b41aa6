package outboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// suiteTimeout bounds every call the suites make, so a hung store fails its test
// instead of the whole run.
const suiteTimeout = 30 * time.Second

// RunStoreTests runs the store conformance suite: every behaviour of
// [driver.Store] and of the optional capabilities the store implements
// ([driver.Admin], [driver.Finder], [driver.Retainer], [driver.Notifier]). Subtests
// for a capability the store lacks are skipped with a message saying so. The
// unit-of-work subtests send through [outbox.NewSender] in both write modes.
//
// Every subtest gets its own store from h.New. Subtests run in parallel unless
// h.Sequential is set.
func RunStoreTests(t *testing.T, h StoreHarness) {
	t.Helper()
	require.NotNil(t, h.New, "StoreHarness.New is required")
	s := storeSuite{h: h}
	groups := []struct {
		name  string
		tests []storeTest
	}{
		{"Enqueue", []storeTest{
			{"FetchReturnsSeqOrderPerBucket", s.fetchSeqOrder},
			{"RoundTripsEveryField", s.roundTrip},
			{"FetchLimit", s.fetchLimit},
			{"ConcurrentWritersLoseNothing", s.concurrentWriters},
			{"FetchIncludesNotYetDue", s.fetchNotYetDue},
			{"AllOrNothing", s.enqueueAllOrNothing},
			{"BucketCountMismatch", s.bucketCountMismatch},
		}},
		{"UnitOfWork", []storeTest{
			{"CommitMakesAllVisible", s.unitOfWorkCommit},
			{"RollbackLeavesNothingInEveryMode", s.unitOfWorkRollback},
			{"PanicRollsBackQuietly", s.unitOfWorkPanic},
			{"NestedFailureIsUndone", s.nestedFailure},
			{"NestedPanicIsUndone", s.nestedPanic},
			{"NestedSuccessCommitsWithTheOuter", s.nestedSuccess},
			{"OuterFailureUndoesTheNested", s.nestedOuterFailure},
			{"CallerSetID", s.callerSetID},
			{"SendOutsideOrAfterFails", s.unitOfWorkEnded},
			{"NothingStaged", s.unitOfWorkEmpty},
		}},
		{"Relay", []storeTest{
			{"CompleteDeletesAndIsIdempotent", s.complete},
			{"Reschedule", s.reschedule},
			{"Park", s.park},
		}},
		{"Admin", []storeTest{
			{"ListPaging", s.adminList},
			{"Requeue", s.adminRequeue},
			{"Purge", s.adminPurge},
			{"Stats", s.adminStats},
		}},
		{"Finder", []storeTest{{"Find", s.find}}},
		{"Retainer", []storeTest{{"MarkAndDeleteDispatched", s.retainer}}},
		{"Notifier", []storeTest{{"CommitWakesSubscriber", s.notifier}}},
		{"Lease", []storeTest{
			{"ConcurrentClaimersOneWins", s.leaseExclusive},
			{"ClaimHeldRefusedExpiredTaken", s.leaseClaimExpired},
			{"Renew", s.leaseRenew},
			{"Release", s.leaseRelease},
			{"HeartbeatOnlyMovesForward", s.heartbeat},
			{"HeartbeatRecordsBucketCount", s.heartbeatBucketCount},
			{"HeartbeatRecordsInstance", s.heartbeatInstance},
			{"StopRelay", s.stopRelay},
			{"DeleteRelay", s.deleteRelay},
			{"ReadCoordinationSorted", s.coordinationSorted},
			{"ReadRelays", s.readRelays},
		}},
		{"Lifecycle", []storeTest{
			{"CancelledContext", s.cancelledContext},
			{"Closed", s.closed},
		}},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			if !h.Sequential {
				t.Parallel()
			}
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					if !h.Sequential {
						t.Parallel()
					}
					tc.run(t)
				})
			}
		})
	}
}

type storeTest struct {
	name string
	run  func(t *testing.T)
}

type storeSuite struct{ h StoreHarness }

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), suiteTimeout)
	t.Cleanup(cancel)
	return ctx
}

// testStore is a store under test: its relay side, with its handle beside it for
// what applications do (Transact, sends, Close).
type testStore struct {
	driver.Store
	handle Store
}

func (st testStore) Transact(ctx context.Context, fn func(ctx context.Context) error) error {
	return st.handle.Transact(ctx, fn)
}

func (st testStore) Close() error { return st.handle.Close() }

// relaySide returns the store's relay side itself, so that type assertions find its
// optional capabilities (a testStore's embedded interface hides them).
func relaySide(st driver.Store) driver.Store {
	if ts, ok := st.(testStore); ok {
		return ts.Store
	}
	return st
}

// store returns a fresh store the test closes at its end.
func (s storeSuite) store(t *testing.T, buckets int) testStore {
	t.Helper()
	h := s.h.New(t, buckets)
	require.NotNil(t, h, "StoreHarness.New returned nil")
	d := h.Driver()
	require.NotNil(t, d, "the store's Driver returned nil")
	require.Equal(t, buckets, d.BucketCount(), "the store must report the bucket count it was made with")
	t.Cleanup(func() { _ = h.Close() })
	return testStore{Store: d, handle: h}
}

// msg builds an envelope for bucket (through an explicit partition, which picks the
// bucket as partition modulo the count).
func msg(t *testing.T, st driver.Store, bucket int, payload string) *driver.Envelope {
	t.Helper()
	p := int32(bucket)
	env, err := driver.NewEnvelope(outbox.Message{
		Topic:     "conformance",
		Key:       []byte("key"),
		Payload:   []byte(payload),
		Partition: &p,
	}, st.BucketCount())
	require.NoError(t, err)
	require.Equal(t, bucket, env.Bucket)
	return env
}

func fetch(t *testing.T, st driver.Store, bucket int) []*driver.Envelope {
	t.Helper()
	batch, err := st.Fetch(testContext(t), bucket, 1000)
	require.NoError(t, err)
	return batch.Envelopes
}

func ids(envs []*driver.Envelope) []uuid.UUID {
	out := make([]uuid.UUID, len(envs))
	for i, env := range envs {
		out[i] = env.ID
	}
	return out
}

func payloads(envs []*driver.Envelope) []string {
	out := make([]string, len(envs))
	for i, env := range envs {
		out[i] = string(env.Payload)
	}
	return out
}

// base is a lease clock with a non-zero microsecond part, truncated to microseconds
// as the Leaser contract promises, and far from the host clock so a store that
// consulted its own clock would be caught.
var base = time.Date(2031, 3, 4, 5, 6, 7, 123456000, time.UTC)

func (s storeSuite) fetchSeqOrder(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 4)
	want := map[int][]string{}
	// Interleave buckets across single and multi-envelope writes.
	for round := range 3 {
		var batch []*driver.Envelope
		for b := range 4 {
			p := fmt.Sprintf("r%d-b%d", round, b)
			batch = append(batch, msg(t, st, b, p))
			want[b] = append(want[b], p)
		}
		require.NoError(t, st.Enqueue(ctx, batch...))
		extra := msg(t, st, round, fmt.Sprintf("r%d-single", round))
		require.NoError(t, st.Enqueue(ctx, extra))
		want[round] = append(want[round], string(extra.Payload))
	}
	for b := range 4 {
		got := fetch(t, st, b)
		require.Equal(t, want[b], payloads(got), "bucket %d in commit order", b)
		for i, env := range got {
			require.Positive(t, env.Seq, "Seq starts above zero, so the zero Cursor lists from the start")
			require.Equal(t, b, env.Bucket)
			if i > 0 {
				require.Greater(t, env.Seq, got[i-1].Seq, "Seq strictly increases within a bucket")
			}
		}
	}
}

func (s storeSuite) roundTrip(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	every := make([]byte, 256)
	for i := range every {
		every[i] = byte(i)
	}
	partition := int32(7)
	messages := []outbox.Message{
		{Topic: "orders", Key: every, Payload: every, Headers: []outbox.Header{
			{Key: "dup", Value: []byte("first")},
			{Key: "empty", Value: []byte{}},
			{Key: "dup", Value: []byte("second")},
			{Key: "binary", Value: every},
		}},
		{Topic: "orders", Key: nil, Payload: []byte("keyless")},
		{Topic: "orders", Key: []byte{}, Payload: []byte("empty key")},
		{Topic: "orders", Key: []byte("tombstone"), Payload: nil},
		{Topic: "orders", Key: []byte("empty payload"), Payload: []byte{}},
		{Topic: "payments.v2", Key: []byte("p"), Payload: []byte("pinned"), Partition: &partition},
		{Topic: "unicode-ünïcødé", Key: []byte("ключ"), Payload: []byte("значение"), Headers: []outbox.Header{{Key: "ключ", Value: []byte("v")}}},
	}
	var sent []*driver.Envelope
	for _, m := range messages {
		env, err := driver.NewEnvelope(m, 1)
		require.NoError(t, err)
		sent = append(sent, env)
	}
	require.NoError(t, st.Enqueue(ctx, sent...))
	got := fetch(t, st, 0)
	require.Len(t, got, len(sent))
	for i, want := range sent {
		requireSameEnvelope(t, want, got[i])
		require.Equal(t, driver.Pending, got[i].Status)
		require.Zero(t, got[i].Attempts)
		require.Empty(t, got[i].LastError)
		require.True(t, got[i].Due(time.Now()), "a new envelope is due at once")
	}
}

// requireSameEnvelope checks that got carries want's message and identity unchanged.
func requireSameEnvelope(t *testing.T, want, got *driver.Envelope) {
	t.Helper()
	require.Equal(t, want.ID, got.ID)
	require.Equal(t, want.Topic, got.Topic)
	require.Equal(t, want.Key == nil, got.Key == nil, "nil and empty keys stay distinct (%s)", want.ID)
	require.True(t, bytes.Equal(want.Key, got.Key), "key of %s", want.ID)
	require.Equal(t, want.Payload == nil, got.Payload == nil, "a nil payload (tombstone) and an empty one stay distinct (%s)", want.ID)
	require.True(t, bytes.Equal(want.Payload, got.Payload), "payload of %s", want.ID)
	require.Len(t, got.Headers, len(want.Headers), "headers of %s", want.ID)
	for j, h := range want.Headers {
		require.Equal(t, h.Key, got.Headers[j].Key, "header %d of %s", j, want.ID)
		require.True(t, bytes.Equal(h.Value, got.Headers[j].Value), "header %d of %s", j, want.ID)
	}
	if want.Partition == nil {
		require.Nil(t, got.Partition, "partition of %s", want.ID)
	} else {
		require.NotNil(t, got.Partition, "partition of %s", want.ID)
		require.Equal(t, *want.Partition, *got.Partition)
	}
	require.Equal(t, want.Bucket, got.Bucket)
	require.Equal(t, want.BucketCount, got.BucketCount)
	require.WithinDuration(t, want.CreatedAt, got.CreatedAt, time.Microsecond, "CreatedAt within the store's precision")
}

func (s storeSuite) fetchLimit(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 2)
	var envs []*driver.Envelope
	for i := range 5 {
		envs = append(envs, msg(t, st, 1, fmt.Sprint(i)))
	}
	require.NoError(t, st.Enqueue(ctx, envs...))
	got, err := st.Fetch(ctx, 1, 2)
	require.NoError(t, err)
	require.Equal(t, []string{"0", "1"}, payloads(got.Envelopes), "the head of the bucket")
	require.True(t, got.More, "a batch that stops before pending envelopes must say the bucket has more (Batch.More)")
	got, err = st.Fetch(ctx, 1, 10)
	require.NoError(t, err)
	require.Len(t, got.Envelopes, 5)
	require.False(t, got.More, "a batch that holds every pending envelope of its bucket must not claim more")
	got, err = st.Fetch(ctx, 0, 10)
	require.NoError(t, err)
	require.Empty(t, got.Envelopes, "other buckets are not returned")
	require.False(t, got.More, "an empty bucket has no more")

	// Once the head is completed, the rest is the whole bucket.
	require.NoError(t, st.Complete(ctx, envs[:2]))
	got, err = st.Fetch(ctx, 1, 3)
	require.NoError(t, err)
	require.Equal(t, []string{"2", "3", "4"}, payloads(got.Envelopes))
	got, err = st.Fetch(ctx, 1, 4)
	require.NoError(t, err)
	require.Equal(t, []string{"2", "3", "4"}, payloads(got.Envelopes))
	require.False(t, got.More, "a short batch of a drained bucket must not claim more")
}

func (s storeSuite) concurrentWriters(t *testing.T) {
	const (
		writers = 4
		each    = 10
	)
	ctx := testContext(t)
	st := s.store(t, 2)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				env := msg(t, st, 0, fmt.Sprintf("w%d-%d", w, i))
				if i%2 == 0 {
					// Two-envelope writes interleave with single ones.
					if !assert.NoError(t, st.Enqueue(ctx, env, msg(t, st, 1, "other bucket"))) {
						return
					}
					continue
				}
				if !assert.NoError(t, st.Enqueue(ctx, env)) {
					return
				}
			}
		})
	}
	wg.Wait()
	got := fetch(t, st, 0)
	require.Len(t, got, writers*each, "every concurrent write is fetched")
	next := map[string]int{}
	for i, env := range got {
		if i > 0 {
			require.Greater(t, env.Seq, got[i-1].Seq, "Seq strictly increases within a bucket")
		}
		// Each writer's envelopes appear in the order that writer committed them.
		var w, n int
		_, err := fmt.Sscanf(string(env.Payload), "w%d-%d", &w, &n)
		require.NoError(t, err)
		require.Equal(t, next[fmt.Sprint(w)], n, "writer %d's commits keep their order", w)
		next[fmt.Sprint(w)]++
	}
	require.Len(t, fetch(t, st, 1), writers*each/2)
}

func (s storeSuite) fetchNotYetDue(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	a, b, c := msg(t, st, 0, "a"), msg(t, st, 0, "b"), msg(t, st, 0, "c")
	require.NoError(t, st.Enqueue(ctx, a, b, c))
	later := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	require.NoError(t, st.Reschedule(ctx, a, later, "broker down"))
	require.NoError(t, st.Park(ctx, b, "rejected"))

	got := fetch(t, st, 0)
	require.Equal(t, []string{"a", "c"}, payloads(got), "not-yet-due envelopes are fetched, parked ones are not")
	require.False(t, got[0].Due(time.Now()))
	require.WithinDuration(t, later, got[0].NextAttemptAt, time.Microsecond)
	require.True(t, got[1].Due(time.Now()))
}

func (s storeSuite) enqueueAllOrNothing(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 2)
	good := msg(t, st, 0, "good")
	bad, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: []byte("bad")}, 3)
	require.NoError(t, err)
	err = st.Enqueue(ctx, good, bad)
	require.Error(t, err)
	require.Empty(t, fetch(t, st, 0), "a refused write writes nothing")
	require.Empty(t, fetch(t, st, 1))
	require.NoError(t, st.Enqueue(ctx), "enqueueing nothing is not an error")
}

func (s storeSuite) bucketCountMismatch(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 2)
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: []byte("x")}, 4)
	require.NoError(t, err)
	env.Bucket = 0 // a valid bucket for both counts: only the stamp disagrees
	require.ErrorIs(t, st.Enqueue(ctx, env), outbox.ErrMisconfigured)
	require.Empty(t, fetch(t, st, 0))
}

// transact runs fn in st's unit of work: through the harness's Transact if it has
// one, else the store's own.
func (s storeSuite) transact(ctx context.Context, st testStore, fn func(context.Context) error) error {
	if s.h.Transact != nil {
		return s.h.Transact(ctx, st.handle, fn)
	}
	return st.handle.Transact(ctx, fn)
}

// sender returns a capture on st with the given mode.
func sender(t *testing.T, st outbox.Store, mode outbox.WriteMode) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(st, outbox.SenderConfig{Mode: mode})
	require.NoError(t, err)
	return c
}

// partitioned is a message for bucket (an explicit partition picks the bucket as
// partition modulo the count).
func partitioned(bucket int, payload string) outbox.Message {
	p := int32(bucket)
	return outbox.Message{Topic: "conformance", Key: []byte("key"), Payload: []byte(payload), Partition: &p}
}

var modes = []outbox.WriteMode{outbox.Transactional, outbox.Immediate}

func (s storeSuite) unitOfWorkCommit(t *testing.T) {
	for _, mode := range modes {
		ctx := testContext(t)
		st := s.store(t, 3)
		send := sender(t, st.handle, mode)
		want := map[int][]string{}
		err := s.transact(ctx, st, func(ctx context.Context) error {
			for i := range 6 {
				want[i%3] = append(want[i%3], fmt.Sprint(i))
				if err := send.Send(ctx, partitioned(i%3, fmt.Sprint(i))); err != nil {
					return err
				}
			}
			for b := range 3 {
				require.Empty(t, fetch(t, st, b), "%v: nothing is visible before the unit of work commits", mode)
			}
			return nil
		})
		require.NoError(t, err)
		for b := range 3 {
			require.Equal(t, want[b], payloads(fetch(t, st, b)), "%v: bucket %d holds every send in send order", mode, b)
		}
	}
}

// unitOfWorkRollback: whatever the mode, a send made inside a unit of work that fails
// is not written.
func (s storeSuite) unitOfWorkRollback(t *testing.T) {
	for _, mode := range modes {
		ctx := testContext(t)
		st := s.store(t, 2)
		send := sender(t, st.handle, mode)
		boom := errors.New("application write failed")
		err := s.transact(ctx, st, func(ctx context.Context) error {
			require.NoError(t, send.Send(ctx, partitioned(0, "a")))
			require.NoError(t, send.Send(ctx, partitioned(1, "b")))
			return boom
		})
		require.ErrorIs(t, err, boom, "Transact returns fn's error")
		require.Empty(t, fetch(t, st, 0), "%v: a rolled-back unit of work writes nothing", mode)
		require.Empty(t, fetch(t, st, 1))

		// The store is still usable and a later unit of work commits normally.
		require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
			return send.Send(ctx, partitioned(0, "c"))
		}))
		require.Equal(t, []string{"c"}, payloads(fetch(t, st, 0)), "nothing of the rolled-back unit of work reappears")
	}
}

// unitOfWorkPanic: a panic rolls back, goes on, and is not reported as abandoned.
func (s storeSuite) unitOfWorkPanic(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	send := sender(t, st.handle, outbox.Transactional)
	recovered := func() (r any) {
		defer func() { r = recover() }()
		_ = s.transact(ctx, st, func(ctx context.Context) error {
			require.NoError(t, send.Send(ctx, partitioned(0, "a")))
			panic("handler bug")
		})
		return nil
	}()
	require.Equal(t, "handler bug", recovered, "Transact lets fn's panic go on")
	require.Empty(t, fetch(t, st, 0), "a panicking unit of work writes nothing")
	require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
		return send.Send(ctx, partitioned(0, "b"))
	}), "the store is usable after a panic")
	require.Equal(t, []string{"b"}, payloads(fetch(t, st, 0)))
}

// nestedFailure: a Transact inside a unit of work of the same store is a
// savepoint. When its function fails, its sends are undone and the outer unit goes
// on and commits the rest.
func (s storeSuite) nestedFailure(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	send := sender(t, st.handle, outbox.Transactional)
	boom := errors.New("loyalty points failed")
	require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
		require.NoError(t, send.Send(ctx, partitioned(0, "outer")))
		err := s.transact(ctx, st, func(ctx context.Context) error {
			require.NoError(t, send.Send(ctx, partitioned(0, "inner")))
			return boom
		})
		require.ErrorIs(t, err, boom, "the nested Transact returns its function's error")
		return send.Send(ctx, partitioned(0, "after"))
	}))
	require.Equal(t, []string{"outer", "after"}, payloads(fetch(t, st, 0)), "the failed nested unit's send is undone, the outer unit's commit")
}

// nestedPanic: a nested unit whose function panics is undone like a failed one;
// the panic goes on to the outer function, which may recover and commit.
func (s storeSuite) nestedPanic(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	send := sender(t, st.handle, outbox.Transactional)
	require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
		require.NoError(t, send.Send(ctx, partitioned(0, "outer")))
		recovered := func() (r any) {
			defer func() { r = recover() }()
			_ = s.transact(ctx, st, func(ctx context.Context) error {
				require.NoError(t, send.Send(ctx, partitioned(0, "inner")))
				panic("handler bug")
			})
			return nil
		}()
		require.Equal(t, "handler bug", recovered, "the nested Transact lets the panic go on")
		return send.Send(ctx, partitioned(0, "after"))
	}))
	require.Equal(t, []string{"outer", "after"}, payloads(fetch(t, st, 0)))
}

// nestedSuccess: a nested unit that succeeds commits with the outer unit, never on
// its own, and in send order; a failure two levels in undoes only that level.
func (s storeSuite) nestedSuccess(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	send := sender(t, st.handle, outbox.Transactional)
	require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
		require.NoError(t, send.Send(ctx, partitioned(0, "outer")))
		require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
			require.NoError(t, send.Send(ctx, partitioned(0, "inner")))
			err := s.transact(ctx, st, func(ctx context.Context) error {
				require.NoError(t, send.Send(ctx, partitioned(0, "innermost")))
				return errors.New("innermost failed")
			})
			require.Error(t, err)
			return send.Send(ctx, partitioned(0, "inner after"))
		}))
		require.Empty(t, fetch(t, st, 0), "the nested unit of work does not commit on its own")
		return send.Send(ctx, partitioned(0, "outer after"))
	}))
	require.Equal(t, []string{"outer", "inner", "inner after", "outer after"}, payloads(fetch(t, st, 0)))
}

// nestedOuterFailure: a nested unit that succeeded is undone with the outer unit
// that fails.
func (s storeSuite) nestedOuterFailure(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	send := sender(t, st.handle, outbox.Transactional)
	boom := errors.New("outer failed")
	err := s.transact(ctx, st, func(ctx context.Context) error {
		require.NoError(t, send.Send(ctx, partitioned(0, "outer")))
		require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
			return send.Send(ctx, partitioned(0, "inner"))
		}))
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Empty(t, fetch(t, st, 0), "the outer rollback takes the nested unit's sends with it")
}

// callerSetID: a message that carries its ID is stored under it, in a unit of work
// and in Immediate mode; a message without one gets a UUIDv7; a second message
// with an ID the store holds is refused and writes nothing (unless the harness says
// the store accepts held IDs).
func (s storeSuite) callerSetID(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	a, b := uuid.New(), uuid.New()
	m := partitioned(0, "a")
	m.ID = a
	require.NoError(t, s.transact(ctx, st, func(ctx context.Context) error {
		return sender(t, st.handle, outbox.Transactional).Send(ctx, m)
	}))
	m = partitioned(0, "b")
	m.ID = b
	require.NoError(t, sender(t, st.handle, outbox.Immediate).Send(ctx, m))
	require.NoError(t, sender(t, st.handle, outbox.Immediate).Send(ctx, partitioned(0, "drawn")))
	got := fetch(t, st, 0)
	require.Len(t, got, 3)
	require.Equal(t, []uuid.UUID{a, b}, ids(got[:2]), "the caller's IDs are kept")
	require.EqualValues(t, 7, got[2].ID.Version(), "a message without an ID gets a UUIDv7")

	if s.h.AcceptsHeldIDs {
		return
	}
	again := partitioned(0, "again")
	again.ID = a
	require.Error(t, sender(t, st.handle, outbox.Immediate).Send(ctx, again), "an ID the store holds is refused")
	require.Len(t, fetch(t, st, 0), 3, "the refused message is not written")
}

// unitOfWorkEnded: a send with the ctx of a unit of work that has ended fails
// instead of going nowhere; a Transactional send with a ctx outside any unit fails
// at Send and names the fix.
func (s storeSuite) unitOfWorkEnded(t *testing.T) {
	outer := testContext(t)
	st := s.store(t, 1)
	send := sender(t, st.handle, outbox.Transactional)
	var leaked context.Context
	require.NoError(t, s.transact(outer, st, func(ctx context.Context) error {
		leaked = ctx
		err := send.Send(outer, partitioned(0, "outer ctx"))
		require.ErrorIs(t, err, outbox.ErrNoTransaction, "a send with the ctx Transact was called with is outside the unit")
		require.Contains(t, err.Error(), "the ctx that Transact passes to its function")
		return nil
	}))
	require.ErrorIs(t, send.Send(leaked, partitioned(0, "late")), outbox.ErrClosed, "a send after the unit of work ended")
	require.ErrorIs(t, sender(t, st.handle, outbox.Immediate).Send(leaked, partitioned(0, "late")), outbox.ErrClosed, "in any mode")
	require.Empty(t, fetch(t, st, 0))
}

func (s storeSuite) unitOfWorkEmpty(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	require.NoError(t, s.transact(ctx, st, func(context.Context) error { return nil }), "an empty unit of work succeeds")
	require.Empty(t, fetch(t, st, 0))
}

func (s storeSuite) complete(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	a, b, c := msg(t, st, 0, "a"), msg(t, st, 0, "b"), msg(t, st, 0, "c")
	require.NoError(t, st.Enqueue(ctx, a, b, c))
	require.NoError(t, st.Complete(ctx, []*driver.Envelope{a, c}))
	require.Equal(t, []string{"b"}, payloads(fetch(t, st, 0)))
	require.NoError(t, st.Complete(ctx, []*driver.Envelope{a, c}), "completing twice is not an error")
	require.NoError(t, st.Complete(ctx, []*driver.Envelope{msg(t, st, 0, "never stored")}), "completing an unknown envelope is not an error")
	require.NoError(t, st.Complete(ctx, nil))
	require.Equal(t, []string{"b"}, payloads(fetch(t, st, 0)))
	if f, ok := st.Store.(driver.Finder); ok {
		_, err := f.Find(ctx, a.ID)
		require.ErrorIs(t, err, driver.ErrNotFound, "a completed envelope is deleted")
	}
}

func (s storeSuite) reschedule(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	a, b := msg(t, st, 0, "a"), msg(t, st, 0, "b")
	require.NoError(t, st.Enqueue(ctx, a, b))
	first := time.Now().Add(time.Minute).UTC().Truncate(time.Microsecond)
	require.NoError(t, st.Reschedule(ctx, a, first, "timeout"))
	second := first.Add(2*time.Minute + 345*time.Microsecond)
	require.NoError(t, st.Reschedule(ctx, a, second, "connection refused"))

	got := fetch(t, st, 0)
	require.Equal(t, []string{"a", "b"}, payloads(got), "a rescheduled envelope keeps its place")
	require.Equal(t, 2, got[0].Attempts)
	require.WithinDuration(t, second, got[0].NextAttemptAt, time.Microsecond)
	require.Equal(t, "connection refused", got[0].LastError)
	require.Equal(t, driver.Pending, got[0].Status)
	require.Zero(t, got[1].Attempts, "other envelopes are untouched")
}

func (s storeSuite) park(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	a, b := msg(t, st, 0, "a"), msg(t, st, 0, "b")
	require.NoError(t, st.Enqueue(ctx, a, b))
	require.NoError(t, st.Reschedule(ctx, a, time.Now().UTC(), "first failure"))
	require.NoError(t, st.Park(ctx, a, "message too large"))
	require.Equal(t, []string{"b"}, payloads(fetch(t, st, 0)), "a parked envelope is not fetched")

	admin, ok := st.Store.(driver.Admin)
	if !ok {
		t.Log("store does not implement driver.Admin: the parked envelope's record is not checked")
		return
	}
	parked, err := admin.List(ctx, driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Len(t, parked, 1)
	requireSameEnvelope(t, a, parked[0])
	require.Equal(t, driver.Parked, parked[0].Status)
	require.Equal(t, "message too large", parked[0].LastError)
	require.Equal(t, 2, parked[0].Attempts, "parking records the failed attempt")
}

func (s storeSuite) admin(t *testing.T, st driver.Store) driver.Admin {
	t.Helper()
	admin, ok := relaySide(st).(driver.Admin)
	if !ok {
		t.Skip("store does not implement driver.Admin")
	}
	return admin
}

func (s storeSuite) adminList(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 3)
	admin := s.admin(t, st)
	var all []*driver.Envelope
	for i := range 8 {
		all = append(all, msg(t, st, (i*2)%3, fmt.Sprint(i)))
	}
	require.NoError(t, st.Enqueue(ctx, all...))
	require.NoError(t, st.Park(ctx, all[0], "parked"))

	var listed []*driver.Envelope
	cursor := driver.Cursor{}
	for page := 0; ; page++ {
		require.Less(t, page, 10, "paging must end")
		got, err := admin.List(ctx, driver.Pending, cursor, 3)
		require.NoError(t, err)
		require.LessOrEqual(t, len(got), 3)
		if len(got) == 0 {
			break
		}
		listed = append(listed, got...)
		cursor = driver.After(got[len(got)-1])
	}
	require.Len(t, listed, 7, "every pending envelope once, the parked one not")
	for i := 1; i < len(listed); i++ {
		prev, cur := listed[i-1], listed[i]
		require.True(t, prev.Bucket < cur.Bucket || (prev.Bucket == cur.Bucket && prev.Seq < cur.Seq),
			"List orders by bucket then Seq")
	}
	seen := map[uuid.UUID]bool{}
	for _, env := range listed {
		require.False(t, seen[env.ID])
		seen[env.ID] = true
		require.Equal(t, driver.Pending, env.Status)
	}
	require.False(t, seen[all[0].ID])

	parked, err := admin.List(ctx, driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{all[0].ID}, ids(parked))
	none, err := admin.List(ctx, driver.Dispatched, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Empty(t, none)
}

func (s storeSuite) adminRequeue(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	admin := s.admin(t, st)
	a, b, c := msg(t, st, 0, "a"), msg(t, st, 0, "b"), msg(t, st, 0, "c")
	require.NoError(t, st.Enqueue(ctx, a, b, c))
	require.NoError(t, st.Reschedule(ctx, a, time.Now().Add(time.Hour).UTC(), "slow"))
	require.NoError(t, st.Park(ctx, a, "gave up"))
	require.NoError(t, st.Park(ctx, c, "gave up"))
	require.Equal(t, []string{"b"}, payloads(fetch(t, st, 0)))

	n, err := admin.Requeue(ctx, a.ID, b.ID, c.ID, uuid.New())
	require.NoError(t, err)
	require.Equal(t, 2, n, "only parked envelopes count; pending and unknown IDs are skipped")
	got := fetch(t, st, 0)
	require.Equal(t, []string{"a", "b", "c"}, payloads(got), "requeued envelopes return to their Seq positions")
	for _, env := range got {
		require.Equal(t, driver.Pending, env.Status)
		require.Zero(t, env.Attempts, "requeue resets attempts")
		require.True(t, env.Due(time.Now()), "requeued envelopes are due now")
	}
	n, err = admin.Requeue(ctx, a.ID)
	require.NoError(t, err)
	require.Zero(t, n, "requeueing twice changes nothing")
}

func (s storeSuite) adminPurge(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	admin := s.admin(t, st)
	a, b, c := msg(t, st, 0, "a"), msg(t, st, 0, "b"), msg(t, st, 0, "c")
	require.NoError(t, st.Enqueue(ctx, a, b, c))
	require.NoError(t, st.Park(ctx, b, "bad"))
	n, err := admin.Purge(ctx, a.ID, b.ID, uuid.New())
	require.NoError(t, err)
	require.Equal(t, 2, n, "purge deletes pending and parked envelopes; unknown IDs are skipped")
	require.Equal(t, []string{"c"}, payloads(fetch(t, st, 0)))
	parked, err := admin.List(ctx, driver.Parked, driver.Cursor{}, 10)
	require.NoError(t, err)
	require.Empty(t, parked)
	n, err = admin.Purge(ctx, a.ID)
	require.NoError(t, err)
	require.Zero(t, n)
}

func (s storeSuite) adminStats(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 3)
	admin := s.admin(t, st)

	empty, err := admin.Stats(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0, 0, 0}, empty.Pending)
	require.Zero(t, empty.Parked)
	require.True(t, empty.OldestPending.IsZero(), "no backlog, no oldest")
	require.Positive(t, empty.PendingLimit)

	first := msg(t, st, 2, "oldest")
	require.NoError(t, st.Enqueue(ctx, first))
	var rest []*driver.Envelope
	for i := range 4 {
		env := msg(t, st, 0, fmt.Sprint(i))
		env.CreatedAt = first.CreatedAt.Add(time.Duration(i+1) * time.Millisecond)
		rest = append(rest, env)
	}
	require.NoError(t, st.Enqueue(ctx, rest...))
	require.NoError(t, st.Park(ctx, rest[3], "bad"))

	stats, err := admin.Stats(ctx)
	require.NoError(t, err)
	capped := func(n int) int { return min(n, stats.PendingLimit) }
	require.Equal(t, []int{capped(3), 0, capped(1)}, stats.Pending)
	require.Equal(t, 1, stats.Parked)
	require.WithinDuration(t, first.CreatedAt, stats.OldestPending, time.Microsecond)
}

func (s storeSuite) find(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 2)
	finder, ok := st.Store.(driver.Finder)
	if !ok {
		t.Skip("store does not implement driver.Finder")
	}
	a, b := msg(t, st, 1, "a"), msg(t, st, 1, "b")
	require.NoError(t, st.Enqueue(ctx, a, b))
	require.NoError(t, st.Park(ctx, b, "bad"))
	got, err := finder.Find(ctx, a.ID)
	require.NoError(t, err)
	requireSameEnvelope(t, a, got)
	require.Equal(t, driver.Pending, got.Status)
	got, err = finder.Find(ctx, b.ID)
	require.NoError(t, err, "Find returns envelopes in any status")
	require.Equal(t, driver.Parked, got.Status)
	_, err = finder.Find(ctx, uuid.New())
	require.ErrorIs(t, err, driver.ErrNotFound)
}

func (s storeSuite) retainer(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	ret, ok := st.Store.(driver.Retainer)
	if !ok {
		t.Skip("store does not implement driver.Retainer")
	}
	a, b, c := msg(t, st, 0, "a"), msg(t, st, 0, "b"), msg(t, st, 0, "c")
	require.NoError(t, st.Enqueue(ctx, a, b, c))
	t1 := time.Now().UTC().Truncate(time.Microsecond)
	t2 := t1.Add(time.Minute)
	require.NoError(t, ret.MarkDispatched(ctx, []*driver.Envelope{a}, t1))
	require.NoError(t, ret.MarkDispatched(ctx, []*driver.Envelope{b}, t2))
	require.NoError(t, ret.MarkDispatched(ctx, []*driver.Envelope{a, msg(t, st, 0, "unknown")}, t1), "marking is idempotent and skips unknown envelopes")
	require.Equal(t, []string{"c"}, payloads(fetch(t, st, 0)), "dispatched envelopes are not fetched")

	if admin, ok := st.Store.(driver.Admin); ok {
		kept, err := admin.List(ctx, driver.Dispatched, driver.Cursor{}, 10)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{a.ID, b.ID}, ids(kept))
		require.WithinDuration(t, t1, kept[0].DispatchedAt, time.Microsecond)
	}

	n, err := ret.DeleteDispatched(ctx, t1, 10)
	require.NoError(t, err)
	require.Zero(t, n, "only envelopes dispatched strictly before the cutoff go")
	n, err = ret.DeleteDispatched(ctx, t2.Add(time.Second), 1)
	require.NoError(t, err)
	require.Equal(t, 1, n, "at most limit")
	n, err = ret.DeleteDispatched(ctx, t2.Add(time.Second), 10)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = ret.DeleteDispatched(ctx, t2.Add(time.Second), 10)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, []string{"c"}, payloads(fetch(t, st, 0)), "pending envelopes are never swept")
}

func (s storeSuite) notifier(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 4)
	notifier, ok := st.Store.(driver.Notifier)
	if !ok {
		t.Skip("store does not implement driver.Notifier")
	}
	subCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := notifier.Subscribe(subCtx)

	// Notifications may arrive asynchronously (LISTEN/NOTIFY); retry the write until
	// one for our bucket shows up, so a subscription still being set up does not fail
	// the test.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	require.NoError(t, st.Enqueue(ctx, msg(t, st, 3, "wake")))
	for woken := false; !woken; {
		select {
		case b, ok := <-ch:
			require.True(t, ok, "the channel stays open while the context lives")
			woken = b == 3
		case <-tick.C:
			require.NoError(t, st.Enqueue(ctx, msg(t, st, 3, "wake")))
		case <-deadline:
			t.Fatal("a commit to bucket 3 woke no subscriber within 10s")
		}
	}

	cancel()
	closed := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-closed:
			t.Fatal("the subscription did not close after its context ended")
		}
	}
}

func (s storeSuite) leaseExclusive(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 2)
	const claimers = 8
	for _, bucket := range []int{0, 1} {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var winners []string
		for i := range claimers {
			owner := fmt.Sprintf("relay-%d", i)
			wg.Go(func() {
				ok, err := st.Claim(ctx, bucket, owner, base, base.Add(time.Minute))
				assert.NoError(t, err)
				if ok {
					mu.Lock()
					winners = append(winners, owner)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		require.Len(t, winners, 1, "exactly one of %d concurrent claimers of bucket %d wins", claimers, bucket)
		coord, err := st.ReadCoordination(ctx)
		require.NoError(t, err)
		lease := leaseOf(t, coord, bucket)
		require.Equal(t, winners[0], lease.Owner)
		require.True(t, lease.ExpiresAt.Equal(base.Add(time.Minute)), "expiry round-trips exactly: %v", lease.ExpiresAt)
	}
}

func leaseOf(t *testing.T, c driver.Coordination, bucket int) driver.Lease {
	t.Helper()
	for _, l := range c.Leases {
		if l.Bucket == bucket {
			return l
		}
	}
	require.Failf(t, "no lease", "bucket %d has no lease in %+v", bucket, c.Leases)
	return driver.Lease{}
}

func relayOf(t *testing.T, c driver.Coordination, id string) driver.RelayRecord {
	t.Helper()
	for _, r := range c.Relays {
		if r.ID == id {
			return r
		}
	}
	require.Failf(t, "no relay", "relay %q has no record in %+v", id, c.Relays)
	return driver.RelayRecord{}
}

func (s storeSuite) leaseClaimExpired(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	expiry := base.Add(30 * time.Second)
	ok, err := st.Claim(ctx, 0, "a", base, expiry)
	require.NoError(t, err)
	require.True(t, ok, "an absent lease is claimable")

	ok, err = st.Claim(ctx, 0, "b", expiry.Add(-time.Microsecond), expiry.Add(time.Minute))
	require.NoError(t, err)
	require.False(t, ok, "a lease held until after now is not claimable")
	ok, err = st.Claim(ctx, 0, "a", base, expiry.Add(time.Minute))
	require.NoError(t, err)
	require.False(t, ok, "not even by its owner: owners renew")

	takeover := expiry.Add(time.Minute + 7*time.Microsecond)
	ok, err = st.Claim(ctx, 0, "b", expiry, takeover)
	require.NoError(t, err)
	require.True(t, ok, "a lease expired at now is claimable")
	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	lease := leaseOf(t, coord, 0)
	require.Equal(t, "b", lease.Owner)
	require.True(t, lease.ExpiresAt.Equal(takeover), "want %v, got %v", takeover, lease.ExpiresAt)
}

func (s storeSuite) leaseRenew(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 2)
	first := base.Add(30 * time.Second)
	ok, err := st.Claim(ctx, 1, "a", base, first)
	require.NoError(t, err)
	require.True(t, ok)
	held := driver.Lease{Bucket: 1, Owner: "a", ExpiresAt: first}

	ok, err = st.Renew(ctx, driver.Lease{Bucket: 1, Owner: "b", ExpiresAt: first}, base, first.Add(time.Minute))
	require.NoError(t, err)
	require.False(t, ok, "another owner cannot renew")

	second := first.Add(10*time.Second + 1*time.Microsecond)
	ok, err = st.Renew(ctx, held, base.Add(10*time.Second), second)
	require.NoError(t, err)
	require.True(t, ok, "the owner renews under the expiry it read")
	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	require.True(t, leaseOf(t, coord, 1).ExpiresAt.Equal(second))

	ok, err = st.Renew(ctx, held, base.Add(11*time.Second), second.Add(time.Minute))
	require.NoError(t, err)
	require.False(t, ok, "a renewal under a stale expiry is refused")

	held.ExpiresAt = second
	ok, err = st.Renew(ctx, held, second, second.Add(time.Minute))
	require.NoError(t, err)
	require.False(t, ok, "an expired lease is never revived by a renewal")

	ok, err = st.Renew(ctx, driver.Lease{Bucket: 0, Owner: "a", ExpiresAt: first}, base, first)
	require.NoError(t, err)
	require.False(t, ok, "a lease never claimed cannot be renewed")
}

func (s storeSuite) leaseRelease(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	expiry := base.Add(time.Minute)
	ok, err := st.Claim(ctx, 0, "a", base, expiry)
	require.NoError(t, err)
	require.True(t, ok)

	ok, err = st.Release(ctx, driver.Lease{Bucket: 0, Owner: "b", ExpiresAt: expiry})
	require.NoError(t, err)
	require.False(t, ok, "release is guarded by owner")
	ok, err = st.Release(ctx, driver.Lease{Bucket: 0, Owner: "a", ExpiresAt: expiry.Add(-time.Second)})
	require.NoError(t, err)
	require.False(t, ok, "release is guarded by expiry")

	ok, err = st.Release(ctx, driver.Lease{Bucket: 0, Owner: "a", ExpiresAt: expiry})
	require.NoError(t, err)
	require.True(t, ok)
	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range coord.Leases {
		require.True(t, l.Free(base), "a released lease is free: %+v", l)
	}
	ok, err = st.Release(ctx, driver.Lease{Bucket: 0, Owner: "a", ExpiresAt: expiry})
	require.NoError(t, err)
	require.False(t, ok, "releasing twice changes nothing")

	ok, err = st.Claim(ctx, 0, "b", base, expiry.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok, "a released lease is claimable before its old expiry")
}

func (s storeSuite) heartbeatInstance(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	first := driver.Instance{Host: "host-1.example", PID: 4242, Nonce: "0123456789abcdef"}
	// The longest host and nonce every store keeps whole.
	second := driver.Instance{Host: strings.Repeat("h", driver.MaxInstanceHost), PID: 1 << 30, Nonce: strings.Repeat("n", driver.MaxInstanceNonce)}
	for i, want := range []driver.Instance{first, second, {}} {
		at := base.Add(time.Duration(i) * time.Second)
		ok, err := st.Heartbeat(ctx, "relay-a", at, 8, want)
		require.NoError(t, err)
		require.True(t, ok)
		coord, err := st.ReadCoordination(ctx)
		require.NoError(t, err)
		got := relayOf(t, coord, "relay-a").Instance
		require.Equal(t, want, got, "the instance of the last heartbeat (zero: unknown), from ReadCoordination")
		relays, err := st.ReadRelays(ctx)
		require.NoError(t, err)
		require.Len(t, relays, 1)
		require.Equal(t, want, relays[0].Instance, "the instance of the last heartbeat, from ReadRelays")
	}
	// A stop stamp keeps the instance that wrote the last heartbeat.
	ok, err := st.Heartbeat(ctx, "relay-a", base.Add(time.Minute), 8, first)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, st.StopRelay(ctx, "relay-a", base.Add(2*time.Minute)))
	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	r := relayOf(t, coord, "relay-a")
	require.True(t, r.Stopped())
	require.Equal(t, first, r.Instance)
}

func (s storeSuite) heartbeat(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	beat := func(at time.Time) bool {
		ok, err := st.Heartbeat(ctx, "relay-a", at, 8, driver.Instance{})
		require.NoError(t, err)
		return ok
	}
	require.True(t, beat(base), "the first heartbeat creates the record")
	require.False(t, beat(base), "an equal timestamp is refused")
	require.False(t, beat(base.Add(-time.Microsecond)), "an older timestamp is refused")
	later := base.Add(time.Second + time.Microsecond)
	require.True(t, beat(later))
	require.False(t, beat(base.Add(time.Second)), "a late, abandoned heartbeat cannot move LastSeen back")

	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	r := relayOf(t, coord, "relay-a")
	require.True(t, r.LastSeen.Equal(later), "LastSeen round-trips exactly: want %v, got %v", later, r.LastSeen)
	require.False(t, r.Stopped())
}

func (s storeSuite) stopRelay(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	ok, err := st.Heartbeat(ctx, "a", base, 8, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	stop := base.Add(5 * time.Second)
	require.NoError(t, st.StopRelay(ctx, "a", stop))

	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	r := relayOf(t, coord, "a")
	require.True(t, r.Stopped())
	require.True(t, r.StoppedAt.Equal(stop), "StoppedAt round-trips exactly")
	require.True(t, r.LastSeen.Equal(stop), "stopping moves LastSeen forward")
	require.Equal(t, 8, r.BucketCount, "stopping keeps the bucket count")

	ok, err = st.Heartbeat(ctx, "a", stop.Add(-time.Second), 16, driver.Instance{})
	require.NoError(t, err)
	require.False(t, ok, "a heartbeat the relay abandoned cannot revive it")
	coord, err = st.ReadCoordination(ctx)
	require.NoError(t, err)
	require.True(t, relayOf(t, coord, "a").Stopped())
	require.Equal(t, 8, relayOf(t, coord, "a").BucketCount, "a refused heartbeat leaves the bucket count")

	restart := stop.Add(time.Second)
	ok, err = st.Heartbeat(ctx, "a", restart, 8, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	coord, err = st.ReadCoordination(ctx)
	require.NoError(t, err)
	r = relayOf(t, coord, "a")
	require.False(t, r.Stopped(), "a later heartbeat (a restart) clears StoppedAt")
	require.True(t, r.LastSeen.Equal(restart))

	// Stopping with an earlier time keeps LastSeen.
	early := restart.Add(-time.Minute)
	require.NoError(t, st.StopRelay(ctx, "a", early))
	coord, err = st.ReadCoordination(ctx)
	require.NoError(t, err)
	r = relayOf(t, coord, "a")
	require.True(t, r.Stopped())
	require.True(t, r.LastSeen.Equal(restart), "LastSeen never moves back")
}

func (s storeSuite) deleteRelay(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 1)
	ok, err := st.Heartbeat(ctx, "a", base, 1, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = st.Heartbeat(ctx, "b", base, 1, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)

	ok, err = st.DeleteRelay(ctx, "a", base.Add(-time.Microsecond))
	require.NoError(t, err)
	require.False(t, ok, "a record that moved on since it was read is kept")
	ok, err = st.DeleteRelay(ctx, "a", base)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = st.DeleteRelay(ctx, "a", base)
	require.NoError(t, err)
	require.False(t, ok, "deleting twice changes nothing")
	ok, err = st.DeleteRelay(ctx, "nobody", base)
	require.NoError(t, err)
	require.False(t, ok)

	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	require.Len(t, coord.Relays, 1)
	require.Equal(t, "b", coord.Relays[0].ID)
}

func (s storeSuite) coordinationSorted(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 4)
	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	require.Empty(t, coord.Leases, "a new store has no leases")
	require.Empty(t, coord.Relays)

	for _, b := range []int{3, 0, 2} {
		ok, err := st.Claim(ctx, b, fmt.Sprintf("owner-%d", b), base, base.Add(time.Duration(b+1)*time.Second))
		require.NoError(t, err)
		require.True(t, ok)
	}
	for _, id := range []string{"relay-c", "relay-a", "relay-b"} {
		ok, err := st.Heartbeat(ctx, id, base, 4, driver.Instance{})
		require.NoError(t, err)
		require.True(t, ok)
	}
	coord, err = st.ReadCoordination(ctx)
	require.NoError(t, err)
	var buckets []int
	for _, l := range coord.Leases {
		buckets = append(buckets, l.Bucket)
		require.Equal(t, fmt.Sprintf("owner-%d", l.Bucket), l.Owner)
		require.True(t, l.ExpiresAt.Equal(base.Add(time.Duration(l.Bucket+1)*time.Second)))
	}
	require.Equal(t, []int{0, 2, 3}, buckets, "leases sorted by bucket; never-leased buckets absent")
	var relays []string
	for _, r := range coord.Relays {
		relays = append(relays, r.ID)
	}
	require.Equal(t, []string{"relay-a", "relay-b", "relay-c"}, relays, "relays sorted by ID")
}

func (s storeSuite) heartbeatBucketCount(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 4)
	beat := func(at time.Time, buckets int) bool {
		ok, err := st.Heartbeat(ctx, "a", at, buckets, driver.Instance{})
		require.NoError(t, err)
		return ok
	}
	record := func() driver.RelayRecord {
		coord, err := st.ReadCoordination(ctx)
		require.NoError(t, err)
		return relayOf(t, coord, "a")
	}
	require.True(t, beat(base, 4))
	require.Equal(t, 4, record().BucketCount, "the first heartbeat records the bucket count")

	later := base.Add(time.Second)
	require.True(t, beat(later, 16))
	r := record()
	require.Equal(t, 16, r.BucketCount, "a later heartbeat replaces the bucket count")
	require.True(t, r.LastSeen.Equal(later))

	require.False(t, beat(later, 32), "an equal timestamp is refused")
	require.False(t, beat(base.Add(500*time.Millisecond), 8), "an older timestamp is refused")
	r = record()
	require.Equal(t, 16, r.BucketCount, "a refused heartbeat leaves the bucket count")
	require.True(t, r.LastSeen.Equal(later), "a refused heartbeat leaves LastSeen")
	require.False(t, r.Stopped())
	requireRelays(t, ctx, st, []driver.RelayRecord{r})

	unknown := later.Add(time.Second)
	require.True(t, beat(unknown, 0))
	require.Zero(t, record().BucketCount, "a heartbeat with an unknown count (0) records 0")
}

func (s storeSuite) readRelays(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t, 4)
	got, err := st.ReadRelays(ctx)
	require.NoError(t, err)
	require.Empty(t, got, "a new store has no relay records")

	// "Relay-Z" sorts first byte-wise and last without regard to case: IDs sort as
	// strings.Compare does, whatever the backend's collation.
	beats := []struct {
		id      string
		at      time.Time
		buckets int
	}{
		{"relay-c", base, 4},
		{"Relay-Z", base.Add(3 * time.Second), 4},
		{"relay-a", base.Add(time.Second + time.Microsecond), 4},
		{"relay-b", base.Add(2 * time.Second), 8},
	}
	for _, b := range beats {
		ok, err := st.Heartbeat(ctx, b.id, b.at, b.buckets, driver.Instance{})
		require.NoError(t, err)
		require.True(t, ok)
	}
	stop := base.Add(5 * time.Second)
	require.NoError(t, st.StopRelay(ctx, "relay-b", stop))
	require.NoError(t, st.StopRelay(ctx, "relay-d", stop), "a relay stopped before its first heartbeat")
	ok, err := st.Claim(ctx, 0, "relay-a", base, base.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok, "a lease beside the relay records is not one of them")

	want := []driver.RelayRecord{
		{ID: "Relay-Z", LastSeen: base.Add(3 * time.Second), BucketCount: 4},
		{ID: "relay-a", LastSeen: base.Add(time.Second + time.Microsecond), BucketCount: 4},
		{ID: "relay-b", LastSeen: stop, StoppedAt: stop, BucketCount: 8},
		{ID: "relay-c", LastSeen: base, BucketCount: 4},
		{ID: "relay-d", LastSeen: stop, StoppedAt: stop},
	}
	coord, err := st.ReadCoordination(ctx)
	require.NoError(t, err)
	require.True(t, sameRelays(want, coord.Relays), "ReadCoordination: want %+v, got %+v", want, coord.Relays)
	requireRelays(t, ctx, st, want)

	// A later heartbeat shows in ReadRelays too (once a stale copy has caught up).
	ok, err = st.Heartbeat(ctx, "relay-b", stop.Add(time.Second), 16, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	want[2] = driver.RelayRecord{ID: "relay-b", LastSeen: stop.Add(time.Second), BucketCount: 16}
	requireRelays(t, ctx, st, want)
	ok, err = st.DeleteRelay(ctx, "relay-d", stop)
	require.NoError(t, err)
	require.True(t, ok)
	requireRelays(t, ctx, st, want[:4])
}

// requireRelays waits until ReadRelays returns want: it may serve a slightly stale
// copy, so a store whose reads lag its writes gets until the test's deadline to catch
// up, and a store that reads its own writes passes at the first call.
func requireRelays(t *testing.T, ctx context.Context, st driver.Store, want []driver.RelayRecord) {
	t.Helper()
	for wait := time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		got, err := st.ReadRelays(ctx)
		require.NoError(t, err)
		if sameRelays(want, got) {
			return
		}
		select {
		case <-ctx.Done():
			require.Failf(t, "ReadRelays never caught up", "want %+v, got %+v", want, got)
		case <-time.After(wait):
		}
	}
}

// sameRelays compares records field by field, times by instant.
func sameRelays(a, b []driver.RelayRecord) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].ID != b[i].ID || !a[i].LastSeen.Equal(b[i].LastSeen) || !a[i].StoppedAt.Equal(b[i].StoppedAt) || a[i].BucketCount != b[i].BucketCount {
			return false
		}
	}
	return true
}

// storeCalls lists one call of every store method, for the lifecycle tests.
func storeCalls(st driver.Store, env *driver.Envelope) map[string]func(ctx context.Context) error {
	st = relaySide(st)
	lease := driver.Lease{Bucket: 0, Owner: "a", ExpiresAt: base.Add(time.Minute)}
	calls := map[string]func(ctx context.Context) error{
		"Enqueue":          func(ctx context.Context) error { return st.Enqueue(ctx, env.Clone()) },
		"Fetch":            func(ctx context.Context) error { _, err := st.Fetch(ctx, 0, 10); return err },
		"Complete":         func(ctx context.Context) error { return st.Complete(ctx, []*driver.Envelope{env}) },
		"Reschedule":       func(ctx context.Context) error { return st.Reschedule(ctx, env, base, "x") },
		"Park":             func(ctx context.Context) error { return st.Park(ctx, env, "x") },
		"ReadCoordination": func(ctx context.Context) error { _, err := st.ReadCoordination(ctx); return err },
		"ReadRelays":       func(ctx context.Context) error { _, err := st.ReadRelays(ctx); return err },
		"Heartbeat": func(ctx context.Context) error {
			_, err := st.Heartbeat(ctx, "a", base, 1, driver.Instance{})
			return err
		},
		"StopRelay":   func(ctx context.Context) error { return st.StopRelay(ctx, "a", base) },
		"DeleteRelay": func(ctx context.Context) error { _, err := st.DeleteRelay(ctx, "a", base); return err },
		"Claim": func(ctx context.Context) error {
			_, err := st.Claim(ctx, 0, "a", base, base.Add(time.Minute))
			return err
		},
		"Renew":   func(ctx context.Context) error { _, err := st.Renew(ctx, lease, base, base.Add(time.Hour)); return err },
		"Release": func(ctx context.Context) error { _, err := st.Release(ctx, lease); return err },
	}
	if admin, ok := st.(driver.Admin); ok {
		calls["Admin.List"] = func(ctx context.Context) error {
			_, err := admin.List(ctx, driver.Pending, driver.Cursor{}, 10)
			return err
		}
		calls["Admin.Requeue"] = func(ctx context.Context) error { _, err := admin.Requeue(ctx, env.ID); return err }
		calls["Admin.Purge"] = func(ctx context.Context) error { _, err := admin.Purge(ctx, uuid.New()); return err }
		calls["Admin.Stats"] = func(ctx context.Context) error { _, err := admin.Stats(ctx); return err }
	}
	if f, ok := st.(driver.Finder); ok {
		calls["Finder.Find"] = func(ctx context.Context) error { _, err := f.Find(ctx, env.ID); return err }
	}
	if r, ok := st.(driver.Retainer); ok {
		calls["Retainer.MarkDispatched"] = func(ctx context.Context) error {
			return r.MarkDispatched(ctx, []*driver.Envelope{env}, base)
		}
		calls["Retainer.DeleteDispatched"] = func(ctx context.Context) error {
			_, err := r.DeleteDispatched(ctx, base, 10)
			return err
		}
	}
	return calls
}

func (s storeSuite) cancelledContext(t *testing.T) {
	st := s.store(t, 1)
	env := msg(t, st, 0, "a")
	require.NoError(t, st.Enqueue(testContext(t), env))
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	for name, call := range storeCalls(st, msg(t, st, 0, "b")) {
		require.ErrorIs(t, call(ctx), context.Canceled, "%s with a cancelled context", name)
	}
	err := s.transact(ctx, st, func(ctx context.Context) error {
		return sender(t, st.handle, outbox.Transactional).Send(ctx, partitioned(0, "c"))
	})
	require.ErrorIs(t, err, context.Canceled, "Transact with a cancelled context")
	got := fetch(t, st, 0)
	require.Equal(t, []uuid.UUID{env.ID}, ids(got), "calls with a cancelled context change nothing")
	require.Zero(t, got[0].Attempts)
}

func (s storeSuite) closed(t *testing.T) {
	st := s.store(t, 1)
	env := msg(t, st, 0, "a")
	ctx := testContext(t)
	require.NoError(t, st.Enqueue(ctx, env))
	require.NoError(t, st.Close())
	for name, call := range storeCalls(st, msg(t, st, 0, "b")) {
		require.ErrorIs(t, call(ctx), outbox.ErrClosed, "%s after Close", name)
	}
	err := s.transact(ctx, st, func(ctx context.Context) error {
		return sender(t, st.handle, outbox.Transactional).Send(ctx, partitioned(0, "c"))
	})
	require.ErrorIs(t, err, outbox.ErrClosed, "Transact after Close")
	if n, ok := st.Store.(driver.Notifier); ok {
		select {
		case _, open := <-n.Subscribe(ctx):
			require.False(t, open, "a subscription made after Close is closed")
		case <-time.After(10 * time.Second):
			t.Fatal("a subscription made after Close stayed open")
		}
	}
}
