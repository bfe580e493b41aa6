package outbox

import "context"

// Transactor runs a unit of work. Every store implements it.
//
// Transact runs fn in a transaction of the store. fn's ctx reaches the transaction
// (each store has typed accessors for its own handle: a pgx.Tx, a *sql.Tx, a
// *gorm.DB, DynamoDB items to add) and every send made with that ctx joins it,
// whatever the sender's [WriteMode]. If fn returns nil, the store writes the staged
// messages in the same transaction and commits: the application's writes and its
// messages persist together. If fn returns an error or panics, the transaction rolls
// back and nothing is written; the error is returned as is, the panic goes on.
//
// A Transact on a ctx that is already inside a unit of work of the same store is a
// savepoint of it: if its fn fails or panics, its writes and its sends are undone and
// the outer fn goes on (it sees the error, or the panic); if it succeeds, they commit
// or roll back with the outer unit. A unit that writes nothing commits an empty
// transaction on every store.
type Transactor interface {
	Transact(ctx context.Context, fn func(ctx context.Context) error) error
}

// Store is what a [Sender] built by [NewSender] captures into; every store's handle
// implements it. A store that wraps another (to add metrics, say) implements
// Unwrap() Store, so that a sender built on the wrapper joins the inner store's
// units of work and sees its size limit.
type Store interface {
	Transactor
	// Enqueue writes messages now, all or nothing, in a transaction of its own; a
	// message with a zero ID gets one. It returns [ErrClosed] after the store closed.
	Enqueue(ctx context.Context, msgs ...Message) error
}
