package chaostest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// TestLateCommitKeepsKeyOrderAcrossProcesses: a transaction that took an earlier Seq
// but commits after a relay has fetched past it must still come out before the later
// messages of its key. Writer A serialises its writes to key K: K1 commits, then K2 is
// written. Meanwhile another writer's message (Seq after K1's) committed and was
// relayed first. The relay runs "in another process": on its own store handle, so it
// learns nothing of the commits from memory. The chaos runs found this case broken
// when the SQL store started a bucket's fetch at the head it had last seen.
func TestLateCommitKeepsKeyOrderAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	pool := postgresPool(t, 4)
	s, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: uniqueTable("late"), BucketCount: 1})
	s = migrated(t, s, err)
	// The relay runs in another process: its own store on the same tables.
	relayStore, err := sqlstore.NewPgx(pool, s.Config())
	require.NoError(t, err)
	defer func() { _ = relayStore.Close() }()
	msg := func(key, payload string) outbox.Message {
		return outbox.Message{Topic: "t", Key: []byte(key), Payload: []byte(payload)}
	}

	// Writer A's transaction takes its Seq for K1 and stays open.
	txA, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = txA.Rollback(ctx) }()
	_, err = s.EnqueuePgxTx(ctx, txA, msg("K", "K1"))
	require.NoError(t, err)

	// Writer B commits a later Seq on another key, and a relay publishes it.
	require.NoError(t, s.Enqueue(ctx, msg("other", "O1")))
	rec := outboxtest.NewRecorder()
	relay := func() {
		d, err := relay.New(relayStore, rec, relay.Config{RelayID: "late"})
		require.NoError(t, err)
		_, err = d.RunOnce(ctx)
		require.NoError(t, err)
	}
	relay()
	require.Equal(t, 1, rec.Len())

	// Writer A commits K1, then writes K2: commit order on K is K1, K2.
	require.NoError(t, txA.Commit(ctx))
	require.NoError(t, s.Enqueue(ctx, msg("K", "K2")))

	// The store's head must show K1 before K2, and the relay must publish them so.
	head, err := relayStore.Driver().Fetch(ctx, 0, 10)
	require.NoError(t, err)
	var got []string
	for _, e := range head.Envelopes {
		got = append(got, string(e.Payload))
	}
	require.Equal(t, []string{"K1", "K2"}, got, "Fetch must return every pending message in Seq order")
	relay()
	var order []string
	for _, e := range rec.Messages() {
		order = append(order, string(e.Payload))
	}
	require.Equal(t, []string{"O1", "K1", "K2"}, order)
}
