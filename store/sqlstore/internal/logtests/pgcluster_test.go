package logtests

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/internal/pgcluster"
)

// A cluster of the test's own runs with the settings asked for, survives an
// immediate stop and a restart, and is gone after the test.
func TestClusterRunsWithItsSettings(t *testing.T) {
	c := pgcluster.Start(t, pgcluster.Logical)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	walLevel := func() string {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		require.NoError(t, err)
		defer conn.Close(ctx)
		var level string
		require.NoError(t, conn.QueryRow(ctx, "SHOW wal_level").Scan(&level))
		return level
	}
	require.Equal(t, "logical", walLevel())
	require.NoError(t, c.Stop("immediate"))
	_, err := pgx.Connect(ctx, c.URL("postgres"))
	require.Error(t, err, "the server is stopped")
	require.NoError(t, c.Restart())
	require.Equal(t, "logical", walLevel())
}
