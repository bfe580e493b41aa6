package tests

import (
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// TestMigrateUpgradesTheRelayTable: a schema at version 1 (relay rows without a
// bucket count) fails the relay calls with an error that says to migrate, and
// Migrate adds the column, keeping the rows, which read as count 0 (unknown) until
// their relay's next heartbeat. A version 2 step found applied already (by a
// concurrent Migrate or a team's own tooling) is taken as done.
func TestMigrateUpgradesTheRelayTable(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{BucketCount: 4})
		relays, versions := s.Config().RelayTable, s.Config().Table+"_migrations"
		seen := time.Date(2031, 3, 4, 5, 6, 7, 123456000, time.UTC)
		ok, err := drv(s).Heartbeat(ctx, "relay-a", seen, 4, driver.Instance{})
		require.NoError(t, err)
		require.True(t, ok)

		// Back to version 1.
		execDirect(t, s, "ALTER TABLE "+relays+" DROP COLUMN bucket_count")
		execDirect(t, s, "DELETE FROM "+versions+" WHERE version = 2")
		requireMigrate := func(err error, call string) {
			t.Helper()
			require.ErrorIs(t, err, outbox.ErrMisconfigured, call)
			require.ErrorContains(t, err, "run Store.Migrate", call)
		}
		_, err = drv(s).Heartbeat(ctx, "relay-a", seen.Add(time.Second), 4, driver.Instance{})
		requireMigrate(err, "Heartbeat")
		_, err = drv(s).ReadRelays(ctx)
		requireMigrate(err, "ReadRelays")
		_, err = drv(s).ReadCoordination(ctx)
		requireMigrate(err, "ReadCoordination")

		require.NoError(t, s.Migrate(ctx))
		require.Equal(t, 5, countRows(t, s, versions))
		got, err := drv(s).ReadRelays(ctx)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, "relay-a", got[0].ID)
		require.True(t, got[0].LastSeen.Equal(seen), "the row is kept: %v", got[0].LastSeen)
		require.Zero(t, got[0].BucketCount, "a row from before the column has an unknown count")
		ok, err = drv(s).Heartbeat(ctx, "relay-a", seen.Add(time.Second), 4, driver.Instance{})
		require.NoError(t, err)
		require.True(t, ok)
		got, err = drv(s).ReadRelays(ctx)
		require.NoError(t, err)
		require.Equal(t, 4, got[0].BucketCount)

		// The column is there but version 2 is not recorded: Migrate takes the step
		// as done instead of failing on a duplicate column.
		execDirect(t, s, "DELETE FROM "+versions+" WHERE version = 2")
		require.NoError(t, s.Migrate(ctx))
		require.Equal(t, 5, countRows(t, s, versions))
		got, err = drv(s).ReadRelays(ctx)
		require.NoError(t, err)
		require.Equal(t, 4, got[0].BucketCount, "nothing was lost")
	})
}

// TestMigrateAddsTheRelayInstance: a schema at version 4 (relay rows without the
// instance columns) fails a relay's Check and the relay calls with an error that says
// to migrate; Migrate adds the columns, keeping the rows, which read as an unknown
// instance until their relay's next heartbeat. Columns found there already with
// version 5 unrecorded are taken as added.
func TestMigrateAddsTheRelayInstance(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{BucketCount: 4})
		relays, versions := s.Config().RelayTable, s.Config().Table+"_migrations"
		seen := time.Date(2031, 3, 4, 5, 6, 7, 123456000, time.UTC)
		inst := driver.Instance{Host: "host-a", PID: 77, Nonce: "00ff00ff00ff00ff"}
		ok, err := drv(s).Heartbeat(ctx, "relay-a", seen, 4, inst)
		require.NoError(t, err)
		require.True(t, ok)

		// Back to version 4.
		for _, col := range []string{"instance_host", "instance_pid", "instance_nonce"} {
			execDirect(t, s, "ALTER TABLE "+relays+" DROP COLUMN "+col)
		}
		execDirect(t, s, "DELETE FROM "+versions+" WHERE version = 5")
		requireMigrate := func(err error, call string) {
			t.Helper()
			require.ErrorIs(t, err, outbox.ErrMisconfigured, call)
			require.ErrorContains(t, err, "run Store.Migrate", call)
		}
		requireMigrate(drv(s).Check(ctx), "Check")
		_, err = drv(s).Heartbeat(ctx, "relay-a", seen.Add(time.Second), 4, inst)
		requireMigrate(err, "Heartbeat")
		_, err = drv(s).ReadRelays(ctx)
		requireMigrate(err, "ReadRelays")
		_, err = drv(s).ReadCoordination(ctx)
		requireMigrate(err, "ReadCoordination")

		require.NoError(t, s.Migrate(ctx))
		require.NoError(t, drv(s).Check(ctx))
		require.Equal(t, 5, countRows(t, s, versions))
		got, err := drv(s).ReadRelays(ctx)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.True(t, got[0].LastSeen.Equal(seen), "the row is kept: %v", got[0].LastSeen)
		require.Equal(t, 4, got[0].BucketCount)
		require.True(t, got[0].Instance.IsZero(), "a row from before the columns has an unknown instance: %+v", got[0].Instance)
		ok, err = drv(s).Heartbeat(ctx, "relay-a", seen.Add(time.Second), 4, inst)
		require.NoError(t, err)
		require.True(t, ok)

		// The columns are there but version 5 is not recorded: Migrate takes the
		// steps as done.
		execDirect(t, s, "DELETE FROM "+versions+" WHERE version = 5")
		require.NoError(t, s.Migrate(ctx))
		require.Equal(t, 5, countRows(t, s, versions))
		coord, err := drv(s).ReadCoordination(ctx)
		require.NoError(t, err)
		require.Len(t, coord.Relays, 1)
		require.Equal(t, inst, coord.Relays[0].Instance, "nothing was lost")
	})
}

// TestReadRelaysIsOneSelectOfTheRelayTable: relays call ReadRelays between rounds, so
// it must stay one small statement that reads no lease row.
func TestReadRelaysIsOneSelectOfTheRelayTable(t *testing.T) {
	ctx := testContext(t)
	postgresPool(t) // skips, or fails under CI, when the server is down
	cfg, err := pgxpool.ParseConfig(postgresURL())
	require.NoError(t, err)
	tracer := &commitTracer{}
	cfg.ConnConfig.Tracer = tracer
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := sqlstore.NewPgx(pool, withTable(sqlstore.Config{DisableNotify: true}))
	s = migrated(t, s, err)
	now := time.Now()
	for _, id := range []string{"b", "a"} {
		ok, err := drv(s).Heartbeat(ctx, id, now, 8, driver.Instance{})
		require.NoError(t, err)
		require.True(t, ok)
	}
	ok, err := drv(s).Claim(ctx, 0, "a", now, now.Add(time.Minute))
	require.NoError(t, err)
	require.True(t, ok)

	tracer.mu.Lock()
	tracer.events = nil
	tracer.mu.Unlock()
	got, err := drv(s).ReadRelays(ctx)
	require.NoError(t, err)
	tracer.mu.Lock()
	events := tracer.events
	tracer.mu.Unlock()
	require.Len(t, events, 1, "one statement: %q", events)
	require.True(t, strings.HasSuffix(events[0], " FROM "+s.Config().RelayTable), "the relay table alone: %q", events[0])
	require.Len(t, got, 2)
	require.Equal(t, "a", got[0].ID)
	require.Equal(t, 8, got[0].BucketCount)
}
