// Package orm is what package sqlstore shares with the ORM packages built on it
// (gormstore): the ORM's own object for the transaction of a unit of work, which
// applications reach through the ORM package's typed accessor (gormstore.Tx) rather
// than as an untyped value.
package orm

import (
	"context"

	"github.com/outboxkit/outbox/driver"
)

// Unit is implemented by the units of work of package sqlstore.
type Unit interface {
	driver.Tx
	// ORMHandle returns the handle that the store's Beginner (sqlstore.NewORM)
	// returned with the unit's transaction; nil on a store built otherwise.
	ORMHandle() any
}

// TxHandle returns the ORM handle of the transaction of the innermost sqlstore unit
// of work on ctx. ok is false outside a unit of work, on a store not built with
// sqlstore.NewORM, when its Beginner returned a nil handle, and once the unit has
// ended.
func TxHandle(ctx context.Context) (handle any, ok bool) {
	u, ok := driver.TxFrom[Unit](ctx)
	if !ok {
		return nil, false
	}
	if h := u.ORMHandle(); h != nil {
		return h, true
	}
	return nil, false
}
