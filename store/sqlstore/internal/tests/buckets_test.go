package tests

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// sameTables builds a store on s's tables and client with another config.
func sameTables(t *testing.T, b backend, s *sqlstore.Store, cfg sqlstore.Config) *sqlstore.Store {
	t.Helper()
	base := s.Config()
	cfg.Table, cfg.LeaseTable, cfg.RelayTable = base.Table, base.LeaseTable, base.RelayTable
	if s.Dialect() == sqlstore.SQLite {
		var db *sql.DB
		require.True(t, s.As(&db))
		other, err := sqlstore.NewDB(db, sqlstore.SQLite, cfg)
		require.NoError(t, err)
		return other
	}
	other, err := b.build(t, cfg)
	require.NoError(t, err)
	return other
}

// A writer built with another bucket count than the tables were migrated for would
// write messages to buckets no relay reads: its writes fail, and so do its Migrate and
// a relay's Start on it.
func TestAnotherBucketCountFailsWhereItRuns(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s8 := b.open(t, sqlstore.Config{BucketCount: 8})
		s16 := sameTables(t, b, s8, sqlstore.Config{BucketCount: 16})

		msg := outbox.Message{Topic: "orders", Key: []byte("k"), Payload: []byte("v")}
		requireMismatch := func(err error, call string) {
			t.Helper()
			require.ErrorIs(t, err, outbox.ErrMisconfigured, call)
			require.ErrorContains(t, err, "migrated for 8 buckets", call)
			require.ErrorContains(t, err, "BucketCount 16", call)
		}
		requireMismatch(s16.Enqueue(ctx, msg), "Enqueue")
		sender, err := outbox.NewSender(s16, outbox.SenderConfig{})
		require.NoError(t, err)
		requireMismatch(s16.Transact(ctx, func(ctx context.Context) error {
			return sender.Send(ctx, msg)
		}), "Transact")
		requireMismatch(s16.Migrate(ctx), "Migrate")
		r, err := relay.New(s16, outboxtest.NewRecorder(), relay.Config{})
		require.NoError(t, err)
		requireMismatch(r.Start(ctx), "relay Start")

		// Nothing reached the table; the right count still writes.
		require.Zero(t, countRows(t, s8, s8.Config().Table))
		require.NoError(t, s8.Enqueue(ctx, msg))
		require.Equal(t, 1, countRows(t, s8, s8.Config().Table))
	})
}

// Tables set up from DDL by hand without the recorded count: the first relay to start
// records its count, and a writer with another count then fails.
func TestRelayStartRecordsTheBucketCount(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s8 := b.open(t, sqlstore.Config{BucketCount: 8})
		execDirect(t, s8, "DELETE FROM "+s8.Config().Table+"_settings")
		s16 := sameTables(t, b, s8, sqlstore.Config{BucketCount: 16})
		msg := outbox.Message{Topic: "orders", Payload: []byte("v")}
		require.NoError(t, s16.Enqueue(ctx, msg), "no recorded count: nothing to compare with")

		r, err := relay.New(s8, outboxtest.NewRecorder(), relay.Config{})
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		require.NoError(t, r.Stop(ctx))

		late := sameTables(t, b, s8, sqlstore.Config{BucketCount: 16})
		err = late.Enqueue(ctx, msg)
		require.ErrorIs(t, err, outbox.ErrMisconfigured)
		require.ErrorContains(t, err, "migrated for 8 buckets")
	})
}

// relay.New refuses a relay id the store's columns cannot hold, before anything runs.
func TestRelayIDTooLongForTheStoreFailsAtNew(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		s := b.open(t, sqlstore.Config{})
		_, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: strings.Repeat("r", 256)})
		require.ErrorIs(t, err, outbox.ErrMisconfigured)
		require.ErrorContains(t, err, "RelayID")
		require.ErrorContains(t, err, "255")
		_, err = relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: strings.Repeat("é", 255)})
		require.NoError(t, err, "255 characters fit, whatever their bytes")
	})
}
