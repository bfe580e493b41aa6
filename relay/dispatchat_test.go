package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
)

// DispatchAt drains a bucket up to a Seq without a lookup by ID, under the same lease
// and order rules as DispatchOne.
func TestDispatchAtDrainsTheBucketUpToTheSeq(t *testing.T) {
	t.Parallel()
	ctx, c, store, rec, d := relay(t, 1, "stream", nil)
	a := enqueue(t, store, []byte("a"), 3)
	b := enqueue(t, store, []byte("b"), 1)

	res, err := d.DispatchAt(ctx, a[1].Bucket, a[1].Seq)
	require.NoError(t, err)
	require.Equal(t, 2, res.Published)
	require.Equal(t, 1, res.Buckets)
	require.Equal(t, idsOf(a[:2]), idsOf(rec.Messages()), "earlier messages first, nothing after the target")
	view, err := store.Driver().ReadCoordination(ctx)
	require.NoError(t, err)
	for _, l := range view.Leases {
		require.Empty(t, l.Owner, "the bucket claimed for one dispatch is released")
	}

	// Gone already: nothing to do.
	res, err = d.DispatchAt(ctx, a[0].Bucket, a[0].Seq)
	require.NoError(t, err)
	require.Zero(t, res.Published)

	// A failing earlier message holds the target back: order first.
	rec.FailID(a[2].ID, errBroker, 1)
	res, err = d.DispatchAt(ctx, b[0].Bucket, b[0].Seq)
	require.NoError(t, err)
	require.Equal(t, 1, res.Retried)
	require.Equal(t, 1, res.Published, "another key's message is not held back")
	require.Equal(t, 3, rec.Unique())

	// A bucket another relay holds is left to it.
	more := enqueue(t, store, []byte("a"), 1)
	ok, err := store.Driver().Claim(ctx, 0, "owner", c.Now(), c.Now().Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)
	res, err = d.DispatchAt(ctx, more[0].Bucket, more[0].Seq)
	require.NoError(t, err)
	require.Zero(t, res)

	_, err = d.DispatchAt(ctx, 1, 1)
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "a bucket outside the relay's count")
}
