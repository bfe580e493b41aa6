package tests

import (
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/internal/orm"
)

func TestRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstoreConfig())
		p := int32(5)
		env, err := driver.NewEnvelope(outbox.Message{
			Topic: "t", Key: []byte{}, Payload: nil, Partition: &p,
			Headers: []outbox.Header{{Key: "a", Value: nil}, {Key: "b", Value: []byte{}}, {Key: "a", Value: []byte("x")}},
		}, s.Config().BucketCount)
		require.NoError(t, err)
		env2 := newEnvelope(t, s, "k", "v")
		require.NoError(t, drv(s).Enqueue(ctx, env, env2))
		require.NotZero(t, env.Seq)
		require.Greater(t, env2.Seq, env.Seq)
		got, err := drv(s).Find(ctx, env.ID)
		require.NoError(t, err)
		require.Equal(t, env.ID, got.ID)
		require.Equal(t, env.Seq, got.Seq)
		require.NotNil(t, got.Key)
		require.Empty(t, got.Key)
		require.Nil(t, got.Payload)
		require.Equal(t, env.Headers, got.Headers)
		require.Equal(t, p, *got.Partition)
		require.True(t, env.CreatedAt.Truncate(1000).Equal(got.CreatedAt), "%v != %v", env.CreatedAt, got.CreatedAt)
		got2, err := drv(s).Find(ctx, env2.ID)
		require.NoError(t, err)
		require.Equal(t, []byte("k"), got2.Key)
		require.Equal(t, []byte("v"), got2.Payload)
		require.Nil(t, got2.Headers)
		require.Nil(t, got2.Partition)
	})
}

func TestConfigValidation(t *testing.T) {
	db := sqliteDB(t)
	cases := []struct {
		cfg   sqlstore.Config
		field string
	}{
		{sqlstore.Config{Table: "orders; DROP TABLE x"}, "Config.Table"},
		{sqlstore.Config{Table: "1abc"}, "Config.Table"},
		{sqlstore.Config{Table: "a.b.c"}, "Config.Table"},
		{sqlstore.Config{LeaseTable: "bad-name"}, "Config.LeaseTable"},
		{sqlstore.Config{RelayTable: "x y"}, "Config.RelayTable"},
		{sqlstore.Config{Table: "same", LeaseTable: "same"}, "LeaseTable"},
		{sqlstore.Config{BucketCount: -1}, "Config.BucketCount"},
		{sqlstore.Config{MaxMessageSize: -5}, "Config.MaxMessageSize"},
		{sqlstore.Config{StatsLimit: -1}, "Config.StatsLimit"},
		{sqlstore.Config{VacuumAfter: -2}, "Config.VacuumAfter"},
		{sqlstore.Config{NotifyChannel: "no good"}, "Config.NotifyChannel"},
		{sqlstore.Config{Table: strings.Repeat("t", 60)}, "Config.LeaseTable"},
	}
	for _, c := range cases {
		_, err := sqlstore.NewDB(db, sqlstore.SQLite, c.cfg)
		require.ErrorIs(t, err, outbox.ErrMisconfigured, "%+v", c.cfg)
		require.ErrorContains(t, err, c.field)
	}
	_, err := sqlstore.NewDB(db, sqlstore.Dialect(42), sqlstore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = sqlstore.NewDB(db, sqlstore.SQLite, sqlstore.Config{Table: "main.outbox"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "SQLite names are not schema-qualified")
	_, err = sqlstore.NewDB(nil, sqlstore.SQLite, sqlstore.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	s, err := sqlstore.NewDB(db, sqlstore.PostgreSQL, sqlstore.Config{Table: "billing.outbox"})
	require.NoError(t, err)
	cfg := s.Config()
	require.Equal(t, "billing.outbox_leases", cfg.LeaseTable)
	require.Equal(t, "billing.outbox_relays", cfg.RelayTable)
	require.Equal(t, "billing_outbox", cfg.NotifyChannel)
	require.Equal(t, driver.DefaultBucketCount, cfg.BucketCount)
	require.Equal(t, sqlstore.DefaultMaxMessageSize, s.MaxMessageSize())
}

func TestMigrateIsIdempotentAndDDLMatches(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		require.NoError(t, s.Migrate(ctx), "a second Migrate is a no-op")
		ddl := s.DDL()
		require.NotEmpty(t, ddl)
		for _, stmt := range ddl {
			// MySQL 8 and SQLite have no ADD COLUMN IF NOT EXISTS: Migrate reruns such
			// a step by finding the column there (TestMigrateUpgradesTheRelayTable).
			switch {
			case strings.HasPrefix(stmt, "ALTER TABLE "):
			case strings.HasPrefix(stmt, "INSERT "):
				require.Regexp(t, `INSERT IGNORE|ON CONFLICT \(name\) DO NOTHING`, stmt, "recording the bucket count can be rerun")
				require.Contains(t, stmt, fmt.Sprintf("'bucket_count', %d", s.Config().BucketCount), "the DDL records the store's bucket count")
			default:
				require.Contains(t, stmt, "IF NOT EXISTS", "every step can be rerun")
			}
		}
		all := strings.Join(ddl, "\n")
		require.Contains(t, all, s.Config().Table)
		require.Regexp(t, `ALTER TABLE `+s.Config().RelayTable+` ADD COLUMN (IF NOT EXISTS )?bucket_count INT(EGER)? NOT NULL DEFAULT 0`, all,
			"the DDL for teams that migrate themselves adds the relay's bucket count")
		for _, col := range []string{"instance_host", "instance_pid", "instance_nonce"} {
			require.Regexp(t, `ALTER TABLE `+s.Config().RelayTable+` ADD COLUMN (IF NOT EXISTS )?`+col+` `, all,
				"the DDL for teams that migrate themselves adds the relay's instance")
		}
		require.Equal(t, 5, countRows(t, s, s.Config().Table+"_migrations"), "versions 1 to 5")
	})
}

func TestMisuseIsExplained(t *testing.T) {
	ctx := testContext(t)
	s := backendNamed("sqlite/database-sql").open(t, sqlstore.Config{})
	_, err := s.EnqueuePgxTx(ctx, nil)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "EnqueueTx")
	_, err = s.EnqueueTx(ctx, nil)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	// Outside a unit of work no accessor finds a transaction.
	_, ok := sqlstore.SQLTx(ctx)
	require.False(t, ok)
	_, ok = sqlstore.PgxTx(ctx)
	require.False(t, ok)
	_, ok = orm.TxHandle(ctx)
	require.False(t, ok)
}

func TestLimitsAndLargeBatches(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{MaxMessageSize: 64 << 10})
		big := newEnvelope(t, s, "k", strings.Repeat("x", 64<<10))
		err := drv(s).Enqueue(ctx, newEnvelope(t, s, "k", "small"), big)
		require.ErrorIs(t, err, outbox.ErrTooLarge)
		require.ErrorContains(t, err, "MaxMessageSize")
		require.Zero(t, countRows(t, s, s.Config().Table), "nothing of a refused batch is written")

		// More rows than one statement takes: several INSERTs, one transaction.
		splitBatchesAt(t, 300)
		const n = 1000
		envs := make([]*driver.Envelope, n)
		for i := range envs {
			envs[i] = newEnvelope(t, s, fmt.Sprint(i), "p")
		}
		require.NoError(t, drv(s).Enqueue(ctx, envs...))
		require.Equal(t, n, countRows(t, s, s.Config().Table))
		seen := map[int64]bool{}
		for _, env := range envs {
			require.NotZero(t, env.Seq)
			require.False(t, seen[env.Seq])
			seen[env.Seq] = true
		}
		// Each Seq written back is the row's own.
		got, err := drv(s).Find(ctx, envs[n-1].ID)
		require.NoError(t, err)
		require.Equal(t, envs[n-1].Seq, got.Seq)

		// A duplicate ID is refused as invalid input; when it sits in a later
		// statement of a split batch, the earlier statements roll back too.
		err = drv(s).Enqueue(ctx, envs[0])
		require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		more := make([]*driver.Envelope, 0, 701)
		for i := range 700 {
			more = append(more, newEnvelope(t, s, fmt.Sprint(i), "more"))
		}
		err = drv(s).Enqueue(ctx, append(more, envs[0])...)
		require.ErrorIs(t, err, outbox.ErrInvalidMessage)
		require.Equal(t, n, countRows(t, s, s.Config().Table), "a split batch is all or nothing")

		// Completing the whole batch is one call.
		require.NoError(t, drv(s).Complete(ctx, envs))
		require.Zero(t, countRows(t, s, s.Config().Table))
	})
}

func TestDeleteDispatchedInBoundedBatches(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		var envs []*driver.Envelope
		for i := range 25 {
			envs = append(envs, newEnvelope(t, s, fmt.Sprint(i), "p"))
		}
		require.NoError(t, drv(s).Enqueue(ctx, envs...))
		at := time.Now().Add(-time.Hour)
		require.NoError(t, drv(s).MarkDispatched(ctx, envs[:20], at))
		n, err := drv(s).DeleteDispatched(ctx, time.Now(), 8)
		require.NoError(t, err)
		require.Equal(t, 8, n)
		n, err = drv(s).DeleteDispatched(ctx, at, 100)
		require.NoError(t, err)
		require.Zero(t, n, "only rows dispatched before the cut-off go")
		n, err = drv(s).DeleteDispatched(ctx, time.Now(), 100)
		require.NoError(t, err)
		require.Equal(t, 12, n)
		require.Equal(t, 5, countRows(t, s, s.Config().Table), "pending rows stay")
	})
}

// A relay that completes messages makes the store VACUUM the table once
// VacuumAfter rows are gone, so a busy queue reuses its space at once.
func TestCompletedRowsAreVacuumed(t *testing.T) {
	eachPostgres(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{BucketCount: 1, VacuumAfter: 50})
		vacuums := func() int64 {
			var n int64
			require.NoError(t, postgresPool(t).QueryRow(ctx,
				"SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = $1::regclass", s.Config().Table).Scan(&n))
			return n
		}
		var envs []*driver.Envelope
		for i := range 40 {
			envs = append(envs, newEnvelope(t, s, fmt.Sprint(i), "p"))
		}
		require.NoError(t, drv(s).Enqueue(ctx, envs...))
		require.NoError(t, drv(s).Complete(ctx, envs))
		require.Zero(t, vacuums(), "40 deletions are below the threshold")
		var more []*driver.Envelope
		for i := range 10 {
			more = append(more, newEnvelope(t, s, fmt.Sprint(i), "p"))
		}
		require.NoError(t, drv(s).Enqueue(ctx, more...))
		require.NoError(t, drv(s).Complete(ctx, more))
		require.Eventually(t, func() bool { return vacuums() == 1 }, 10*time.Second, 10*time.Millisecond,
			"the 50th deletion starts one VACUUM")
	})
}

func TestEnqueueTxRollsBackWithTheApplication(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstore.Config{})
		sub := drv(s).Subscribe(ctx)
		tx := beginManual(t, ctx, s)
		sctx, scope := outbox.NewScope(ctx)
		defer scope.Release()
		send(t, sctx, s, "a", "staged")
		require.Equal(t, 1, scope.Len())
		written, err := tx.enqueue(sctx, newMessage("b", "extra"))
		require.NoError(t, err)
		require.Zero(t, scope.Len(), "the staged message was taken")
		require.Len(t, written, 2, "the scope's message, then the call's")
		require.Equal(t, []byte("staged"), written[0].Payload)
		require.Equal(t, []byte("extra"), written[1].Payload)
		tx.rollback()
		require.Zero(t, countRows(t, s, s.Config().Table))

		tx = beginManual(t, ctx, s)
		id := uuid.Must(uuid.NewV7())
		written, err = tx.enqueue(ctx, outbox.Message{ID: id, Topic: "orders", Key: []byte("a"), Payload: []byte("again")})
		require.NoError(t, err)
		require.Len(t, written, 1)
		again := written[0]
		require.Equal(t, id, again.ID, "a message's own ID is kept")
		require.NotZero(t, again.Seq)
		require.NoError(t, tx.commit())
		s.NotifyCommitted(written...)
		// On PostgreSQL the listener also wakes every bucket when it connects.
		timeout := time.After(5 * time.Second)
		for woke := false; !woke; {
			select {
			case bucket := <-sub:
				woke = bucket == again.Bucket
			case <-timeout:
				t.Fatal("NotifyCommitted woke no subscriber")
			}
		}
		require.Equal(t, 1, countRows(t, s, s.Config().Table))
	})
}

func TestHeadersSurviveAnyBytes(t *testing.T) {
	ctx := testContext(t)
	s := backendNamed("sqlite/database-sql").open(t, sqlstore.Config{})
	hs := []outbox.Header{{Key: "bin", Value: []byte{0, 1, 2, 255}}, {Key: "nil"}, {Key: "empty", Value: []byte{}},
		{Key: "long", Value: []byte(strings.Repeat("v", 300))}, {Key: "bin", Value: []byte("dup")}}
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: []byte{0, 0xff}, Payload: []byte{0}, Headers: hs}, s.Config().BucketCount)
	require.NoError(t, err)
	require.NoError(t, drv(s).Enqueue(ctx, env))
	got, err := drv(s).Find(ctx, env.ID)
	require.NoError(t, err)
	require.Equal(t, hs, got.Headers)
	require.Nil(t, got.Headers[1].Value)
	require.NotNil(t, got.Headers[2].Value)
	require.Equal(t, []byte{0, 0xff}, got.Key)
}

func TestConcurrentMigrations(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		first := b.open(t, sqlstore.Config{})
		require.NoError(t, first.DropTables(ctx))
		// Several processes starting at once migrate the same fresh tables.
		var stores []*sqlstore.Store
		for range 4 {
			s, err := b.build(t, first.Config())
			require.NoError(t, err)
			stores = append(stores, s)
		}
		if first.Dialect() == sqlstore.SQLite {
			var db *sql.DB
			require.True(t, first.As(&db))
			stores = stores[:0]
			for range 4 {
				s, err := sqlstore.NewDB(db, sqlstore.SQLite, first.Config())
				require.NoError(t, err)
				stores = append(stores, s)
			}
		}
		errs := make(chan error, len(stores))
		for _, s := range stores {
			go func() { errs <- s.Migrate(ctx) }()
		}
		for range stores {
			require.NoError(t, <-errs)
		}
		for _, s := range stores {
			require.NoError(t, drv(s).Enqueue(ctx, newEnvelope(t, s, "k", "v")))
		}
		require.Equal(t, 4, countRows(t, first, first.Config().Table))
		require.Equal(t, 5, countRows(t, first, first.Config().Table+"_migrations"), "every migration, once")
	})
}
