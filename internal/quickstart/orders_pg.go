package quickstart

import (
	"context"
	"errors"

	"github.com/outboxkit/outbox/store/sqlstore"
)

// PgOrders saves orders in PostgreSQL, in the unit of work's pgx transaction.
type PgOrders struct {
	// Insert is the statement, with $1 the id and $2 the amount.
	Insert string
}

// Save inserts the order through the transaction on ctx.
func (p PgOrders) Save(ctx context.Context, o Order) error {
	tx, ok := sqlstore.PgxTx(ctx)
	if !ok {
		return errors.New("orders: Save needs the ctx of a unit of work on a pgx store")
	}
	_, err := tx.Exec(ctx, p.Insert, o.ID, o.Amount)
	return err
}
