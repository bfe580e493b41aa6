package logtests

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// Every write path of the log mode (a unit of work, the application's own
// transaction, an immediate send) writes no row; the stream hands out every message
// with everything an envelope carries, in commit order.
func TestLogModeWritesNoRows(t *testing.T) {
	eachClient(t, func(t *testing.T, c client) {
		ctx := testContext(t)
		s := open(t, c, sqlstore.Config{BucketCount: 4})
		part := int32(3)
		full := outbox.Message{
			ID: uuid.Must(uuid.NewV7()), Topic: "orders", Key: []byte("k1"), Payload: []byte{},
			Headers: []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: "nil"}}, Partition: &part,
		}
		bare := outbox.Message{Topic: "audit"} // nil key, payload and headers stay nil

		tx := sender(t, s, outbox.Transactional)
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			if err := tx.Send(ctx, full); err != nil {
				return err
			}
			return tx.Send(ctx, bare)
		}))
		// A unit that fails writes nothing.
		boom := errors.New("boom")
		require.ErrorIs(t, s.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, tx.Send(ctx, message("lost", 0)))
			return boom
		}), boom)
		// The application's own transaction.
		switch c.name {
		case "pgx":
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(ptx pgx.Tx) error {
				_, err := s.EnqueuePgxTx(ctx, ptx, message("k2", 1))
				return err
			}))
		default:
			stx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = s.EnqueueTx(ctx, stx, message("k2", 1))
			require.NoError(t, err)
			require.NoError(t, stx.Commit())
		}
		// An immediate send.
		require.NoError(t, sender(t, s, outbox.Immediate).Send(ctx, message("k3", 2)))

		require.Zero(t, countRows(t, s), "no row on the fast path")
		st := openStream(t, s)
		envs, _ := readN(t, st, 4)
		requireQuiet(t, st)

		got := envs[0]
		require.Equal(t, full.ID, got.ID)
		require.Equal(t, full.Topic, got.Topic)
		require.Equal(t, full.Key, got.Key)
		require.NotNil(t, got.Payload)
		require.Empty(t, got.Payload)
		require.Equal(t, full.Headers, got.Headers)
		require.Equal(t, part, *got.Partition)
		require.Equal(t, 4, got.BucketCount)
		require.Equal(t, driver.BucketOf(&full, 4), got.Bucket)
		require.WithinDuration(t, time.Now(), got.CreatedAt, time.Minute)
		require.Equal(t, driver.Pending, got.Status)

		require.Equal(t, "audit", envs[1].Topic)
		require.Nil(t, envs[1].Key)
		require.Nil(t, envs[1].Payload)
		require.Nil(t, envs[1].Headers)
		require.Nil(t, envs[1].Partition)
		require.Equal(t, "k2", string(envs[2].Key))
		require.Equal(t, "k3", string(envs[3].Key))
	})
}

// What was handed out and not confirmed comes again to the next reader; what was
// confirmed does not.
func TestStreamResumesFromTheConfirmedPosition(t *testing.T) {
	eachClient(t, func(t *testing.T, c client) {
		ctx := testContext(t)
		s := open(t, c, sqlstore.Config{})
		snd := sender(t, s, outbox.Immediate)
		for i := range 3 {
			require.NoError(t, snd.Send(ctx, message("a", i)))
		}
		st, err := s.Driver().(driver.Streamer).OpenStream(ctx)
		require.NoError(t, err)
		first, _ := readN(t, st, 3)
		require.NoError(t, st.Close(ctx))

		st, err = s.Driver().(driver.Streamer).OpenStream(ctx)
		require.NoError(t, err)
		again, pos := readN(t, st, 3)
		for i := range first {
			require.Equal(t, first[i].ID, again[i].ID, "the same messages, in the same order")
		}
		require.NoError(t, st.Confirm(ctx, pos))
		require.NoError(t, snd.Send(ctx, message("a", 3)))
		require.NoError(t, st.Close(ctx))

		st = openStream(t, s)
		rest, _ := readN(t, st, 1)
		require.Equal(t, "a-3", string(rest[0].Payload), "only what came after the confirmed position")
	})
}

// Two outboxes on one database never read each other's messages; the slot has one
// reader at a time.
func TestTwoOutboxesOnOneDatabase(t *testing.T) {
	need(t)
	ctx := testContext(t)
	a := open(t, clients[0], sqlstore.Config{})
	b := open(t, clients[0], sqlstore.Config{})
	require.NotEqual(t, a.LogPrefix(), b.LogPrefix())
	require.NoError(t, a.Enqueue(ctx, message("a", 0)))
	require.NoError(t, b.Enqueue(ctx, message("b", 0)))
	sa := openStream(t, a)
	got, _ := readN(t, sa, 1)
	require.Equal(t, "a", string(got[0].Key))
	requireQuiet(t, sa)
	sb := openStream(t, b)
	got, _ = readN(t, sb, 1)
	require.Equal(t, "b", string(got[0].Key))

	_, err := a.Driver().(driver.Streamer).OpenStream(ctx)
	require.Error(t, err, "a second reader of a slot is refused")
}

// The log mode is PostgreSQL's alone, and needs wal_level=logical: MySQL and SQLite
// refuse it when the store is built; a server without logical decoding (the shared
// server, which is never reconfigured) fails Migrate, Check and the first write,
// naming the setting.
func TestLogModeMisconfigured(t *testing.T) {
	for _, d := range []sqlstore.Dialect{sqlstore.MySQL, sqlstore.SQLite} {
		_, err := sqlstore.NewDB(&sql.DB{}, d, sqlstore.Config{Mode: sqlstore.LogMode})
		require.ErrorIs(t, err, outbox.ErrMisconfigured, d.String())
		require.ErrorContains(t, err, "LogMode needs PostgreSQL")
	}
	_, err := sqlstore.NewPgx(pool, sqlstore.Config{Mode: sqlstore.LogMode, Slot: "Not-A-Slot"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	ctx := testContext(t)
	replica, err := pgx.Connect(ctx, testenv.PostgresURL())
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	defer replica.Close(ctx)
	var level string
	require.NoError(t, replica.QueryRow(ctx, "SHOW wal_level").Scan(&level))
	if level == "logical" {
		t.Skip("the shared server has wal_level=logical; this test needs one without")
	}
	sharedDB, err := sql.Open("pgx", testenv.PostgresURL())
	require.NoError(t, err)
	defer sharedDB.Close()
	s, err := sqlstore.NewDB(sharedDB, sqlstore.PostgreSQL, sqlstore.Config{Table: uniqueTable(), Mode: sqlstore.LogMode, Logger: quietLog})
	require.NoError(t, err)
	requireWalLevel := func(err error, call string) {
		t.Helper()
		require.ErrorIs(t, err, outbox.ErrMisconfigured, call)
		require.ErrorContains(t, err, "wal_level = logical", call)
		require.ErrorContains(t, err, "rds.logical_replication", call)
	}
	requireWalLevel(s.Migrate(ctx), "Migrate")
	requireWalLevel(s.Enqueue(ctx, message("k", 0)), "Enqueue")
	requireWalLevel(s.Driver().Check(ctx), "Check")
	var exists bool
	require.NoError(t, replica.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.Config().Table).Scan(&exists))
	require.False(t, exists, "Migrate created nothing")
}

// A store whose slot is missing refuses to write: the message would be lost.
func TestLogModeWithoutSlotRefusesWrites(t *testing.T) {
	need(t)
	ctx := testContext(t)
	s := open(t, clients[0], sqlstore.Config{})
	require.NoError(t, s.DropLog(ctx))
	err := s.Enqueue(ctx, message("k", 0))
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "run Store.Migrate")
	require.ErrorIs(t, s.Driver().Check(ctx), outbox.ErrMisconfigured)
	require.NoError(t, s.Migrate(ctx))
	require.NoError(t, s.Enqueue(ctx, message("k", 1)))
	require.NoError(t, s.Driver().Check(ctx))
}

// Only a store in LogMode offers a stream: a relay on a TableMode store drains the
// table alone.
func TestOnlyTheLogModeOffersAStream(t *testing.T) {
	need(t)
	s, err := sqlstore.NewPgx(pool, sqlstore.Config{})
	require.NoError(t, err)
	_, ok := s.Driver().(driver.Streamer)
	require.False(t, ok)
	l := open(t, clients[0], sqlstore.Config{})
	_, ok = l.Driver().(driver.Streamer)
	require.True(t, ok)
	_, ok = l.Driver().(driver.Admin)
	require.True(t, ok, "the log mode's relay side keeps every capability")
}
