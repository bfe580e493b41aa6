// Package quickstart holds the programs the README and docs/testing.md show, so that
// they compile and run in the test suite: a service written against
// [outbox.Transactor] and [outbox.Sender], run on PostgreSQL in production and on the
// memory store in its tests.
package quickstart

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/outboxkit/outbox"
)

// Order is the service's state.
type Order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// ErrDeclined is a business failure inside the unit of work.
var ErrDeclined = errors.New("order declined")

// Orders saves orders. Its implementations find the store's transaction on ctx.
type Orders interface {
	Save(ctx context.Context, o Order) error
}

// OrderService depends on two small interfaces, not on a database or a broker.
type OrderService struct {
	uow    outbox.Transactor
	sender outbox.Sender
	orders Orders
}

// NewOrderService returns the service.
func NewOrderService(uow outbox.Transactor, sender outbox.Sender, orders Orders) *OrderService {
	return &OrderService{uow: uow, sender: sender, orders: orders}
}

// Place saves the order and announces it, both or neither.
func (s *OrderService) Place(ctx context.Context, o Order) error {
	return s.uow.Transact(ctx, func(ctx context.Context) error {
		if err := s.orders.Save(ctx, o); err != nil {
			return err
		}
		body, err := json.Marshal(o)
		if err != nil {
			return err
		}
		if err := s.sender.Send(ctx, outbox.Message{Topic: "order-placed", Key: []byte(o.ID), Payload: body}); err != nil {
			return err
		}
		if o.Amount <= 0 {
			return ErrDeclined // after the write and the send: both roll back
		}
		return nil
	})
}
