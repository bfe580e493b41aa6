package main

import (
	"context"
	"database/sql"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/internal/testenv"
)

// execSQL runs a statement on a SQL backend's database, beside the store.
func execSQL(t *testing.T, b backend, stmt string) {
	t.Helper()
	ctx := context.Background()
	driverName, dsn := "sqlite", strings.TrimPrefix(b.args[1], "sqlite:")
	switch b.name {
	case "postgres":
		conn, err := pgx.Connect(ctx, testenv.PostgresURL())
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
		return
	case "mariadb":
		driverName, dsn = "mysql", testenv.MySQLDSN()
	}
	db, err := sql.Open(driverName, dsn)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.ExecContext(ctx, stmt)
	require.NoError(t, err, stmt)
}

func TestMigrateStatus(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			if b.setup != "migrate" {
				code, _, errOut := ctl(t, b, "migrate", "-status")
				require.Equal(t, exitUsage, code, errOut)
				require.Contains(t, errOut, "create-table")
				return
			}
			st, err := openStore(context.Background(), storeOptions{DSN: b.args[1], Table: flagValue(b.args, "-table")})
			require.NoError(t, err)
			t.Cleanup(func() {
				_ = st.SQL.DropTables(context.Background())
				_ = st.Close()
			})

			out := ok(t, b, "migrate", "-status")
			require.Contains(t, out, "never migrated: run outboxctl migrate")
			notApplied := regexp.MustCompile(`(?m)^(\d+)\s+\(not applied\)$`).FindAllStringSubmatch(out, -1)
			require.GreaterOrEqual(t, len(notApplied), 4, "every version this outboxctl knows: %s", out)
			require.NotContains(t, ok(t, b, "migrate", "-status"), "up to date", "-status changes nothing")

			ok(t, b, "migrate")
			out = ok(t, b, "migrate", "-status")
			require.Contains(t, out, "up to date")
			applied := regexp.MustCompile(`(?m)^(\d+)\s+\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`).FindAllStringSubmatch(out, -1)
			require.Len(t, applied, len(notApplied), out)
			for i := range applied {
				require.Equal(t, notApplied[i][1], applied[i][1])
			}

			// A table whose last version is missing is behind.
			last := applied[len(applied)-1][1]
			execSQL(t, b, "DELETE FROM "+st.SQL.Config().Table+"_migrations WHERE version = "+last)
			out = ok(t, b, "migrate", "-status")
			require.Contains(t, out, "behind: version "+last+" not applied")
		})
	}
}
