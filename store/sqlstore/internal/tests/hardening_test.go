package tests

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// A MySQL client with the found-rows flag counts a matched-but-unchanged row as
// affected; a claim of a bucket another relay holds must still be refused.
func TestClaimRefusedWithFoundRowsClient(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	mysqlDB(t) // skips, or fails under CI, when the server is down
	dsn := mysqlDSN()
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("mysql", dsn+sep+"clientFoundRows=true")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s, err := sqlstore.NewDB(db, sqlstore.MySQL, withTable(sqlstore.Config{BucketCount: 2}))
	s = migrated(t, s, err)

	now := time.Now().UTC().Truncate(time.Microsecond)
	won, err := drv(s).Claim(ctx, 1, "a", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, won)
	won, err = drv(s).Claim(ctx, 1, "b", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.False(t, won, "a held lease is not granted to a second relay")

	ok, err := drv(s).Heartbeat(ctx, "a", now, 2, driver.Instance{})
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = drv(s).Heartbeat(ctx, "a", now, 2, driver.Instance{})
	require.NoError(t, err)
	require.False(t, ok, "a heartbeat that does not move forward is refused")
}

// A failure cause with a NUL byte or invalid UTF-8 (a custom transport's error text)
// must not make Park or Reschedule fail, or the message could never be parked.
func TestCauseWithAnyBytesIsStored(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{BucketCount: 1})
		env := newEnvelope(t, s, "k", "v")
		require.NoError(t, drv(s).Enqueue(ctx, env))
		cause := "broker said \x00\xff\xfe" + strings.Repeat("é", 3000)
		require.NoError(t, drv(s).Reschedule(ctx, env, time.Now(), cause))
		require.NoError(t, drv(s).Park(ctx, env, cause))
		parked, err := drv(s).List(ctx, driver.Parked, driver.Cursor{}, 10)
		require.NoError(t, err)
		require.Len(t, parked, 1)
		require.Equal(t, 2, parked[0].Attempts)
		require.True(t, utf8.ValidString(parked[0].LastError))
		require.True(t, strings.HasPrefix(parked[0].LastError, "broker said \uFFFD"), parked[0].LastError)
	})
}

func TestRelayIDsTheColumnsCannotHoldAreRefused(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s := backendNamed("sqlite/database-sql").open(t, sqlstore.Config{BucketCount: 1}) // no server needed
	now := time.Now()
	_, err := drv(s).Claim(ctx, 0, "", now, now.Add(time.Minute))
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = drv(s).Heartbeat(ctx, strings.Repeat("r", 256), now, 1, driver.Instance{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
}

// On MySQL the store keeps its INSERTs prepared on its own *sql.DB; an application
// transaction on another *sql.DB (a second pool to the same server) still takes its
// messages, and repeated writes of every size keep their Seq order.
func TestEnqueueTxOnAnotherPoolOfTheServer(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	s, err := sqlstore.NewDB(mysqlDB(t), sqlstore.MySQL, withTable(sqlstore.Config{BucketCount: 1}))
	s = migrated(t, s, err)
	other, err := sql.Open("mysql", mysqlDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	var want []string
	for round := range 3 {
		for _, db := range []*sql.DB{mysqlDB(t), other} {
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			var msgs []outbox.Message
			for i := range round*7 + 1 { // 1, 8 and 15 rows: each a statement of its own
				payload := fmt.Sprintf("%d-%p-%d", round, db, i)
				msgs = append(msgs, newMessage("k", payload))
				want = append(want, payload)
			}
			written, err := s.EnqueueTx(ctx, tx, msgs...)
			require.NoError(t, err)
			require.Len(t, written, len(msgs))
			require.NoError(t, tx.Commit())
		}
	}
	fetched, err := drv(s).Fetch(ctx, 0, 1000)
	require.NoError(t, err)
	var got []string
	for _, env := range fetched.Envelopes {
		got = append(got, string(env.Payload))
	}
	require.Equal(t, want, got, "every write landed, in Seq order")
}
