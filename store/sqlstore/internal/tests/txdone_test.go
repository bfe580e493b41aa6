package tests

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// Ending the unit's *sql.Tx inside fn is the one way to lose messages through the
// front door: the application's rows commit (or roll back) without the unit's
// messages. The unit then fails with an error that says exactly that.
func TestEndingTheUnitsSQLTxInsideFnFailsLoudly(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		if b.client != "database/sql" {
			t.Skip("PgxTx hands out a transaction whose Commit and Rollback refuse")
		}
		for _, end := range []string{"commit", "rollback"} {
			t.Run(end, func(t *testing.T) {
				ctx := testContext(t)
				s := b.open(t, sqlstore.Config{})
				orders := businessTable(t, s)
				sender := capture(t, s, outbox.Transactional)
				err := s.Transact(ctx, func(ctx context.Context) error {
					tx, ok := sqlstore.SQLTx(ctx)
					require.True(t, ok)
					if _, err := tx.ExecContext(ctx, "INSERT INTO "+orders+" (id, note) VALUES (1, 'x')"); err != nil {
						return err
					}
					if err := sender.Send(ctx, orderMsg(1)); err != nil {
						return err
					}
					if end == "commit" {
						return tx.Commit()
					}
					return tx.Rollback()
				})
				require.ErrorIs(t, err, outbox.ErrMisconfigured)
				require.ErrorContains(t, err, "1 message(s) were NOT written")
				require.ErrorContains(t, err, "never call Commit or Rollback on SQLTx's transaction")
				want := 0
				if end == "commit" {
					want = 1
				}
				require.Equal(t, want, countRows(t, s, orders), "the application's row went with the tx it ended")
				require.Zero(t, countRows(t, s, s.Config().Table), "no message was written")
			})
		}
	})
}
