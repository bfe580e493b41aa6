package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Transact runs fn as a unit of work (see [outbox.Transactor]). Inside fn, [AddItems]
// adds the application's own writes to the unit, and every send made with fn's ctx
// (whatever the sender's [outbox.WriteMode]) is staged on it. When fn returns nil,
// the application's items and every staged message are written in ONE
// TransactWriteItems request: they persist together or not at all. Sequence numbers
// are reserved at that moment, so a unit that rolls back costs no request. When fn
// fails or panics, nothing is written and fn's error (or panic) goes on.
//
// A Transact on a ctx already inside a unit of work of this store is a savepoint of
// it: when its function fails or panics, the items it added and the messages it sent
// are dropped and the outer unit goes on; when it succeeds, they stay in the outer
// unit and are written with it.
//
// A unit that adds no item and sends nothing makes no request and returns nil. A unit
// whose only write is one message is written with a conditional PutItem, one write
// unit less than a transaction.
//
// The commit refuses, before sending anything, a unit of more than 100 items in all
// (application items and messages), an item over 400 KB or a request over 4 MB, with
// [outbox.ErrTooLarge]. A transaction that DynamoDB cancels (an application item's
// condition failed, a conflicting write) is returned wrapped: errors.As finds the
// SDK's *types.TransactionCanceledException, whose CancellationReasons list the
// application items first, in the order they were added, then the messages in the
// order they were sent.
//
// The commit is safe under the SDK's retries: a retried request that finds the
// messages of its own first attempt under their reserved sequence numbers reports
// success. An application that retries the whole unit (after a cancellation, say)
// calls Transact again: its function adds its items and sends again.
func (s *Store) Transact(ctx context.Context, fn func(ctx context.Context) error) error {
	return driver.RunTransaction(ctx, driver.Unit{Owner: s, BucketCount: s.cfg.BucketCount, Begin: s.begin}, fn)
}

func (s *Store) begin(ctx context.Context) (driver.Tx, error) {
	if err := s.enter(ctx); err != nil {
		return nil, err
	}
	return &unit{s: s}, nil
}

// unit is one unit of work of a Store: the application's items, gathered until the
// commit writes them with the staged envelopes.
type unit struct {
	s *Store

	mu    sync.Mutex
	items []types.TransactWriteItem
	size  int // of items, as transactItemSize measures them
	ended bool
}

// AddItems adds the application's own writes (Put, Update, Delete or ConditionCheck,
// on any table) to the unit of work on ctx, the ctx that [Store.Transact] passes to
// its function (in a nested Transact, to its savepoint). They are written in the
// unit's TransactWriteItems request, before the messages, when the unit commits; if
// the function fails, they are dropped with its messages. A failed condition on one
// of them cancels the whole transaction.
//
// AddItems fails with [outbox.ErrNoTransaction] when ctx is not inside an open unit
// of work of a Store (the ctx Transact was called with, or one whose unit has
// ended), and with [outbox.ErrTooLarge] when the unit's application items alone
// cannot fit in one transaction: more than 100 items, a Put item over 400 KB, or
// items over 4 MB. A refused call adds none of its items. The messages count
// against the same limits at the commit, which refuses a unit that does not fit
// before sending anything.
func AddItems(ctx context.Context, items ...types.TransactWriteItem) error {
	u, ok := driver.TxFrom[*unit](ctx)
	if !ok {
		return fmt.Errorf("dynamostore.AddItems: call it with the ctx that (*dynamostore.Store).Transact passes to its function, before the function returns: %w", outbox.ErrNoTransaction)
	}
	return u.add(items)
}

func (u *unit) add(items []types.TransactWriteItem) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ended {
		return fmt.Errorf("%w: dynamostore.AddItems: the unit of work this ctx belongs to has ended; add items inside the function given to Transact, before it returns", outbox.ErrClosed)
	}
	if n := len(u.items) + len(items); n > maxTransactItems {
		return fmt.Errorf("%w: dynamostore.AddItems: the unit's application items would be %d items, over a transaction's %d; nothing was added, split the work into several units",
			outbox.ErrTooLarge, n, maxTransactItems)
	}
	size := u.size
	for i, it := range items {
		n, put := transactItemSize(it)
		if put && n > maxItemSize {
			return fmt.Errorf("%w: dynamostore.AddItems: item %d is a %d-byte Put, over DynamoDB's 400 KB item limit; nothing was added",
				outbox.ErrTooLarge, i, n)
		}
		size += n
	}
	if size > maxTransactSize {
		return fmt.Errorf("%w: dynamostore.AddItems: the unit's application items take about %d bytes, over a transaction's 4 MB; nothing was added",
			outbox.ErrTooLarge, size)
	}
	u.items = append(u.items, items...)
	u.size = size
	return nil
}

// mark returns how many items the unit holds, for the inbox's cancellation index.
func (u *unit) mark() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.items)
}

// Savepoint marks the items the unit holds, for a nested Transact.
func (u *unit) Savepoint(context.Context) (driver.Savepoint, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.ended {
		return nil, fmt.Errorf("%w: dynamostore: the unit of work has ended", outbox.ErrClosed)
	}
	return savepoint{u: u, n: len(u.items), size: u.size}, nil
}

// savepoint is a mark in a unit's items: a nested unit of work adds after it.
type savepoint struct {
	u    *unit
	n    int
	size int
}

// Release keeps the items added since the mark in the unit.
func (savepoint) Release(context.Context) error { return nil }

// Rollback drops the items added since the mark.
func (sp savepoint) Rollback(context.Context) error {
	sp.u.mu.Lock()
	defer sp.u.mu.Unlock()
	if len(sp.u.items) >= sp.n {
		clear(sp.u.items[sp.n:])
		sp.u.items, sp.u.size = sp.u.items[:sp.n], sp.size
	}
	return nil
}

// Commit writes the unit: see Store.Transact.
func (u *unit) Commit(ctx context.Context, envs []*driver.Envelope) error {
	u.mu.Lock()
	u.ended = true
	items, size := u.items, u.size
	u.items = nil
	u.mu.Unlock()
	return u.s.commit(ctx, items, size, envs)
}

// Rollback drops the unit: nothing was sent, nothing was reserved.
func (u *unit) Rollback(context.Context) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ended = true
	u.items = nil
}

// commit writes items and envs in one request, after checking DynamoDB's limits.
//
// itemsSize is what items add to the request; AddItems measured them, and refused any
// Put over DynamoDB's item limit, as it took them.
func (s *Store) commit(ctx context.Context, items []types.TransactWriteItem, itemsSize int, envs []*driver.Envelope) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	total := len(items) + len(envs)
	switch {
	case total == 0:
		return nil
	case total > maxTransactItems:
		return fmt.Errorf("%w: dynamostore: the unit of work has %d items (%d application items and %d messages), over a transaction's %d; nothing was written, split the work into several units",
			outbox.ErrTooLarge, total, len(items), len(envs), maxTransactItems)
	}
	size, err := s.check(envs)
	if err != nil {
		return err
	}
	if size += itemsSize; size > maxTransactSize {
		return fmt.Errorf("%w: dynamostore: the unit of work takes about %d bytes, over a transaction's 4 MB; nothing was written, split the work into several units",
			outbox.ErrTooLarge, size)
	}
	if err := s.reserve(ctx, envs); err != nil {
		return err
	}
	if len(items) == 0 && len(envs) == 1 {
		err = s.putOne(ctx, "commit", envs[0])
	} else {
		err = s.transact(ctx, "commit", items, envs)
	}
	if err != nil {
		return err
	}
	s.notify(envs)
	return nil
}

// errCancelled explains a transaction DynamoDB cancelled, keeping the exception
// reachable with errors.As; nil if err is no cancellation.
func errCancelled(op string, appItems int, err error) error {
	if _, ok := errors.AsType[*types.TransactionCanceledException](err); !ok {
		return nil
	}
	order := "in the order of the messages"
	if appItems > 0 {
		order = "the application items first, in the order added, then the messages"
	}
	return fmt.Errorf("dynamostore: %s: DynamoDB cancelled the transaction and wrote nothing (its CancellationReasons list %s): %w", op, order, err)
}
