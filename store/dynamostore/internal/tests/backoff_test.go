package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// pollCounter is the store's relay side with its idle probe counted per bucket: one
// call is one poll of that bucket by the worker.
type pollCounter struct {
	relaySide
	polls [2]atomic.Int64
}

func (p *pollCounter) HasPending(ctx context.Context, bucket int) (bool, error) {
	p.polls[bucket].Add(1)
	return p.relaySide.HasPending(ctx, bucket)
}

// Driver hands the counting relay side to relay.New.
func (p *pollCounter) Driver() driver.Store { return p }

// bucketRequests is what the proxy counted for one bucket's message partition and
// sequence counter.
type bucketRequests struct{ fetches, probes, counters int }

func requestsOf(d *testDB, bucket int) bucketRequests {
	f, p := d.proxy.queriesOf("OUTBOX#MESSAGES#" + strconv.Itoa(bucket))
	_, c := d.proxy.queriesOf("OUTBOX#SEQUENCE#" + strconv.Itoa(bucket))
	return bucketRequests{fetches: f, probes: p, counters: c}
}

func (a bucketRequests) minus(b bucketRequests) bucketRequests {
	return bucketRequests{a.fetches - b.fetches, a.probes - b.probes, a.counters - b.counters}
}

// TestBackedOffHeadCostsNothingUntilDue: a key whose head failed and backs off, with
// 100 messages of 1 KiB behind it, costs a polling worker no fetch until the head is
// due, and no more requests per poll than an idle bucket (one when the fetch window
// holds the whole bucket: the sequence counter; none when the bucket fills the
// window). A commit of another key in this process still gets out at once, and once
// the head is due everything goes out in order.
func TestBackedOffHeadCostsNothingUntilDue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		batch       int
		perPoll     int // requests per poll of the blocked bucket
		commitWakes bool
	}{
		{batch: 100, perPoll: 0},
		{batch: 200, perPoll: 1, commitWakes: true},
	} {
		t.Run(fmt.Sprintf("batch%d", tc.batch), func(t *testing.T) {
			t.Parallel()
			d := newTestDB(t)
			s := d.newStore(t, dynamostore.Config{BucketCount: 2})
			table := s.Config().TableName
			ctx := context.Background()
			blockedKey := keyForBucket(t, 0, 2)
			head := envelope(t, 2, "t", blockedKey, []byte("head"))
			require.NoError(t, s.Driver().Enqueue(ctx, head))
			want := []string{"head"}
			for i := 0; i < 100; i += 50 {
				var envs []*driver.Envelope
				for j := range 50 {
					p := fmt.Sprintf("behind-%03d-", i+j)
					want = append(want, p+string(bytes.Repeat([]byte{'x'}, 1024-len(p))))
					envs = append(envs, envelope(t, 2, "t", blockedKey, []byte(want[len(want)-1])))
				}
				require.NoError(t, s.Driver().Enqueue(ctx, envs...))
			}

			const backoff = 8 * time.Second
			rec := outboxtest.NewRecorder()
			rec.FailID(head.ID, errors.New("broker refused"), 1)
			store := &pollCounter{relaySide: side(s)}
			disp, err := relay.New(store, rec, relay.Config{
				RelayID: "relay-backoff", BucketCount: 2, BatchSize: tc.batch, PollInterval: 20 * time.Millisecond,
				BackoffBase: backoff, BackoffMax: backoff, BacklogInterval: -1,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			})
			require.NoError(t, err)
			require.NoError(t, disp.Start(ctx))
			t.Cleanup(func() { _ = disp.Stop(context.Background()) })

			// Wait for the head's failure to be recorded, and read when it is due.
			var due time.Time
			require.Eventually(t, func() bool {
				item := rawItem(t, d, table, "OUTBOX#MESSAGES#0", "0000000000000000001")
				n, ok := item["NextAttemptAtUtc"].(*types.AttributeValueMemberN)
				if !ok {
					return false
				}
				ticks, err := strconv.ParseInt(n.Value, 10, 64)
				require.NoError(t, err)
				due = time.Unix(0, (ticks-621_355_968_000_000_000)*100)
				return true
			}, 30*time.Second, 10*time.Millisecond)
			require.Greater(t, time.Until(due), backoff/2, "the machine is too slow for this test's backoff")

			// The drain that rescheduled the head may go on with one more pass (its
			// window was full): measure from the second poll after it.
			require.Eventually(t, func() bool { return disp.Stats().Retried == 1 }, 30*time.Second, 5*time.Millisecond)
			after := store.polls[0].Load()
			require.Eventually(t, func() bool { return store.polls[0].Load() >= after+2 }, 30*time.Second, 5*time.Millisecond)
			polls0, polls1 := store.polls[0].Load(), store.polls[1].Load()
			reqs0, reqs1 := requestsOf(d, 0), requestsOf(d, 1)
			for store.polls[0].Load()-polls0 < 30 && time.Until(due) > backoff/4 {
				time.Sleep(20 * time.Millisecond)
			}
			blocked, idle := requestsOf(d, 0).minus(reqs0), requestsOf(d, 1).minus(reqs1)
			blockedPolls, idlePolls := store.polls[0].Load()-polls0, store.polls[1].Load()-polls1
			require.True(t, time.Now().Before(due))
			// Up to 30 polls are measured; a starved machine may poll far less often
			// than every 20 ms, and a few polls still tell zero fetches from one a poll.
			require.GreaterOrEqual(t, blockedPolls, int64(3), "too few polls to measure")
			t.Logf("blocked bucket: %d polls, %+v; idle bucket: %d polls, %+v", blockedPolls, blocked, idlePolls, idle)
			assert.Zero(t, blocked.fetches, "no fetch of the backed-off bucket before its head is due")
			assert.Zero(t, blocked.probes, "the backed-off bucket needs no head probe")
			assert.InDelta(t, float64(tc.perPoll)*float64(blockedPolls), float64(blocked.counters), 1, "requests per poll of the backed-off bucket")
			assert.InDelta(t, float64(idlePolls), float64(idle.probes+idle.counters), 1, "the idle bucket costs one probe a poll")
			assert.Zero(t, idle.fetches)

			if tc.commitWakes {
				other := envelope(t, 2, "t", anotherKeyForBucket(t, 0, 2, blockedKey), []byte("other"))
				require.Equal(t, 0, other.Bucket)
				require.NoError(t, s.Driver().Enqueue(ctx, other))
				require.Eventually(t, func() bool { return rec.Count(other.ID) == 1 }, time.Until(due), 10*time.Millisecond,
					"a commit in this process wakes the bucket before the head is due")
			}

			// Once due, the head and the 100 behind it go out, in order.
			require.Eventually(t, func() bool { return len(rec.ByKey()[string(blockedKey)]) == 101 }, time.Until(due)+60*time.Second, 20*time.Millisecond)
			assert.Equal(t, want, payloadsOf(rec.ByKey()[string(blockedKey)]))
		})
	}
}

// anotherKeyForBucket returns a key other than not that lands in bucket among n.
func anotherKeyForBucket(t testing.TB, bucket, n int, not []byte) []byte {
	t.Helper()
	for i := 0; i < 10_000; i++ {
		k := []byte(fmt.Sprintf("other-%d", i))
		if !bytes.Equal(k, not) && driver.BucketOf(&outbox.Message{Key: k}, n) == bucket {
			return k
		}
	}
	t.Fatalf("no other key found for bucket %d", bucket)
	return nil
}

// TestHasPendingSeesOtherWritersOfABackedOffBucket: while a bucket's head backs off,
// a commit by another process (another store on the table) makes the bucket worth a
// fetch again, through the sequence counter; a due message left pending answers yes
// without a request.
func TestHasPendingSeesOtherWritersOfABackedOffBucket(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	relay := d.newStore(t, dynamostore.Config{BucketCount: 1})
	writer, err := dynamostore.New(d.client, relay.Config())
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, writer.Enqueue(ctx,
		message("t", []byte("k"), []byte("head")), message("t", []byte("k"), []byte("behind"))))

	got, err := envelopesOf(relay.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	require.Len(t, got, 2)
	pending, err := side(relay).HasPending(ctx, 0)
	require.NoError(t, err)
	assert.True(t, pending, "the head is due")
	require.NoError(t, relay.Driver().Reschedule(ctx, got[0], time.Now().Add(time.Hour), "broker down"))

	d.proxy.take()
	for range 3 {
		pending, err = side(relay).HasPending(ctx, 0)
		require.NoError(t, err)
		assert.False(t, pending, "nothing can go out before the head is due")
	}
	reqs, _ := d.proxy.take()
	assert.Equal(t, map[string]int{"Query": 3}, reqs, "one counter read a poll")

	other := envelope(t, 1, "t", []byte("other"), []byte("other"))
	require.NoError(t, writer.Driver().Enqueue(ctx, other))
	pending, err = side(relay).HasPending(ctx, 0)
	require.NoError(t, err)
	assert.True(t, pending, "another process committed to the bucket")

	got, err = envelopesOf(relay.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	require.Len(t, got, 3)
	d.proxy.take()
	pending, err = side(relay).HasPending(ctx, 0)
	require.NoError(t, err)
	assert.True(t, pending, "a due message of another key")
	reqs, _ = d.proxy.take()
	assert.Empty(t, reqs)
	require.NoError(t, relay.Driver().Complete(ctx, got[2:]))
	pending, err = side(relay).HasPending(ctx, 0)
	require.NoError(t, err)
	assert.False(t, pending)

	// A bucket that changed hands is probed as usual.
	ok, err := relay.Driver().Claim(ctx, 0, "relay-x", time.Now(), time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	d.proxy.take()
	pending, err = side(relay).HasPending(ctx, 0)
	require.NoError(t, err)
	assert.True(t, pending)
	_, eventual := d.proxy.queriesOf("OUTBOX#MESSAGES#0")
	assert.NotZero(t, eventual, "the head probe")
}
