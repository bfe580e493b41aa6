package tests

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// TestUnorderedRelayPublishesALaterMessageOfABackedOffKey: with a relay that does not
// keep key order, a key's first message backs off for an hour while its second one
// fails once and is due again moments later; the worker publishes the second as soon
// as it is due, not when the first one is.
func TestUnorderedRelayPublishesALaterMessageOfABackedOffKey(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()
	first := envelope(t, 1, "t", []byte("k"), []byte("first"))
	second := envelope(t, 1, "t", []byte("k"), []byte("second"))
	require.NoError(t, s.Driver().Enqueue(ctx, first, second))
	firstDue := time.Now().Add(time.Hour)
	require.NoError(t, s.Driver().Reschedule(ctx, first, firstDue, "broker refused"))

	const retry = 200 * time.Millisecond
	rec := outboxtest.NewRecorder()
	rec.FailID(second.ID, errors.New("broker refused"), 1)
	disp, err := relay.New(s, rec, relay.Config{
		RelayID: "relay-unordered", BucketCount: 1, Unordered: true, PollInterval: 20 * time.Millisecond,
		BackoffBase: retry, BackoffMax: retry, Jitter: -1, BacklogInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, disp.Start(ctx))
	t.Cleanup(func() { _ = disp.Stop(context.Background()) })

	// The second message's first attempt fails; the fetch that follows holds both.
	require.Eventually(t, func() bool { return disp.Stats().Retried == 1 }, 30*time.Second, 5*time.Millisecond)
	// Due again after retry, and the worker polls every 20 ms: a hundred times the
	// work, and still far short of the hour the first message waits.
	require.Eventually(t, func() bool { return rec.Count(second.ID) == 1 }, 100*retry, 10*time.Millisecond,
		"the second message goes out once due, whatever its key's first message waits for")
	assert.Zero(t, rec.Count(first.ID), "the first message still backs off")
	assert.True(t, time.Now().Before(firstDue))
}

// TestHasPendingCountsEveryHeldMessage: after a fetch, the idle probe says a bucket is
// worth a fetch once any message it holds is due, not only each key's first; a later
// message of a key that the relay left pending, due, behind its backed-off first one
// (a relay that keeps key order holds it back) does not make every poll a fetch.
func TestHasPendingCountsEveryHeldMessage(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	s := d.newStore(t, dynamostore.Config{BucketCount: 1})
	ctx := context.Background()
	envs := []*driver.Envelope{
		envelope(t, 1, "t", []byte("k"), []byte("first")),
		envelope(t, 1, "t", []byte("k"), []byte("second")),
		envelope(t, 1, "t", []byte("k"), []byte("third")),
	}
	require.NoError(t, s.Driver().Enqueue(ctx, envs...))
	got, err := envelopesOf(s.Driver().Fetch(ctx, 0, 10))
	require.NoError(t, err)
	require.Len(t, got, 3)

	// The first backs off for an hour; the others are left pending, due: held back.
	require.NoError(t, s.Driver().Reschedule(ctx, got[0], time.Now().Add(time.Hour), "broker refused"))
	pending, err := side(s).HasPending(ctx, 0)
	require.NoError(t, err)
	assert.False(t, pending, "what is held back behind its key's first message waits")

	// The third fails too and is due again soon: the probe says so once it is due.
	next := time.Now().Add(300 * time.Millisecond)
	require.NoError(t, s.Driver().Reschedule(ctx, got[2], next, "broker refused"))
	before := time.Now()
	pending, err = side(s).HasPending(ctx, 0)
	require.NoError(t, err)
	if before.Before(next) {
		assert.False(t, pending, "nothing is due yet")
	}
	require.Eventually(t, func() bool {
		pending, err := side(s).HasPending(ctx, 0)
		require.NoError(t, err)
		return pending
	}, 10*time.Second, 20*time.Millisecond, "a later message of a backed-off key is due")
}
