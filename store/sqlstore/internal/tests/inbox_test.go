package tests

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// effectsTable creates an application table of effects, one row per applied
// message, beside the store's tables.
func effectsTable(t *testing.T, s *sqlstore.Store) string {
	name := s.Config().Table + "_effects"
	execDirect(t, s, "CREATE TABLE "+name+" (k VARCHAR(100) NOT NULL)")
	t.Cleanup(func() { execDirect(t, s, "DROP TABLE IF EXISTS "+name) })
	return name
}

func countWhere(t *testing.T, s *sqlstore.Store, table, key string) int {
	t.Helper()
	ctx := context.Background()
	var pool *pgxpool.Pool
	var db *sql.DB
	var n int
	switch {
	case s.As(&pool):
		require.NoError(t, pool.QueryRow(ctx, "SELECT COUNT(*) FROM "+table+" WHERE k = $1", key).Scan(&n))
	case s.As(&db):
		q := "SELECT COUNT(*) FROM " + table + " WHERE k = ?"
		if s.Dialect() == sqlstore.PostgreSQL {
			q = rebind(q)
		}
		require.NoError(t, db.QueryRowContext(ctx, q, key).Scan(&n))
	}
	return n
}

// TestInboxConformance runs the inbox suite on every database and client kind; the
// consumer's function writes a row of its own in the unit's transaction.
func TestInboxConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			outboxtest.RunInboxTests(t, outboxtest.InboxHarness{
				New: func(t *testing.T) outboxtest.Store {
					s := b.open(t, sqlstore.Config{BucketCount: 1})
					effectsTable(t, s)
					return s
				},
				Effect: func(ctx context.Context, st outboxtest.Store, key string) error {
					s := st.(*sqlstore.Store)
					if len(key) > 100 {
						key = key[:100]
					}
					return execInUnit(ctx, s, "INSERT INTO "+s.Config().Table+"_effects (k) VALUES (?)", key)
				},
				Effects: func(t *testing.T, st outboxtest.Store, key string) int {
					s := st.(*sqlstore.Store)
					if len(key) > 100 {
						key = key[:100]
					}
					return countWhere(t, s, s.Config().Table+"_effects", key)
				},
			})
		})
	}
}

// TestInboxKeysAreCaseSensitive: keys differing only in case are different keys
// (MySQL's default collation would take them as one).
func TestInboxKeysAreCaseSensitive(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		in, err := inbox.New(s, inbox.Config{Consumer: "billing"})
		require.NoError(t, err)
		for _, key := range []string{"Order-1", "order-1", "ORDER-1", "order-1 "} {
			msg := &outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(key)}}}
			res, err := in.Process(ctx, msg, func(context.Context) error { return nil })
			require.NoError(t, err)
			require.False(t, res.Duplicate, "%q is a key of its own", key)
		}
	})
}

// TestInboxUnmigrated: a store whose inbox table is missing says to migrate.
func TestInboxUnmigrated(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		execDirect(t, s, "DROP TABLE "+s.InboxTable())
		in, err := inbox.New(s, inbox.Config{Consumer: "billing"})
		require.NoError(t, err)
		msg := &outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("k")}}}
		_, err = in.Process(ctx, msg, func(context.Context) error { return nil })
		require.ErrorIs(t, err, outbox.ErrMisconfigured)
		require.ErrorContains(t, err, "Migrate")
		require.ErrorContains(t, err, s.InboxTable())
		_, err = in.RemoveExpired(ctx)
		require.ErrorIs(t, err, outbox.ErrMisconfigured)
	})
}

// TestInboxWaitsForRacingUnit: on SQL a second unit on a key that a first holds
// uncommitted waits for it, and then finds the key: its function never runs.
func TestInboxWaitsForRacingUnit(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		if strings.HasPrefix(b.name, "sqlite") {
			t.Skip("SQLite has one writer: the second unit waits at BEGIN, before any key")
		}
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		first, err := inbox.New(s, inbox.Config{Consumer: "billing"})
		require.NoError(t, err)
		second, err := inbox.New(s, inbox.Config{Consumer: "billing"})
		require.NoError(t, err)
		msg := &outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte("k")}}}

		inFirst, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := first.Process(ctx, msg, func(context.Context) error {
				close(inFirst)
				<-release
				return nil
			})
			done <- err
		}()
		<-inFirst
		secondDone := make(chan inbox.Result, 1)
		ran := false
		go func() {
			res, err := second.Process(ctx, msg, func(context.Context) error { ran = true; return nil })
			if err != nil {
				res.Key = "error: " + err.Error()
			}
			secondDone <- res
		}()
		// The second unit cannot finish while the first holds the key: whatever it
		// waits for, it waits until the first ends.
		select {
		case res := <-secondDone:
			t.Fatalf("the second unit finished while the first held the key: %+v", res)
		case <-time.After(200 * time.Millisecond):
		}
		close(release)
		require.NoError(t, <-done)
		res := <-secondDone
		require.True(t, res.Duplicate, "the second unit finds the committed key: %+v", res)
		require.False(t, ran, "its function did not run")
	})
}
