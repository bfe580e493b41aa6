// Package inbox applies the effects of each received message once per consumer.
//
// The outbox delivers at least once: a relay that crashes after the broker
// acknowledged, a consumer that crashes before it acknowledged, a rebalance — each
// delivers a message again. An [Inbox] makes the consumer's side of that safe: it
// runs the consumer's function in the store's unit of work ([outbox.Transactor])
// together with the insert of the message's key under the consumer's name, so the
// key, the consumer's own writes and every message it sends through the outbox
// commit together or not at all. A message whose key is recorded already is
// reported as a duplicate and its function is skipped.
//
//	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
//	...
//	res, err := in.Process(ctx, &msg, func(ctx context.Context) error {
//		tx, _ := sqlstore.PgxTx(ctx)
//		if _, err := tx.Exec(ctx, "UPDATE accounts SET ..."); err != nil {
//			return err
//		}
//		return sender.Send(ctx, receipt) // commits with the update and the key
//	})
//	if err != nil {
//		return err // nothing was recorded: do not acknowledge, the message comes again
//	}
//	// res.Duplicate or not: acknowledge (commit the offset, delete the SQS message)
//
// # Consuming
//
// A [Consumer] is the consume loop for every broker: it receives from a [Source] (each
// transport has one, built on the application's client: kafkatransport.NewSource,
// natstransport.NewSource, rabbitmqtransport.NewSource, redistransport.NewSource,
// sqstransport.NewSource), runs each [Delivery] through Process with the application's
// [Handler], retries a failed one in place with backoff, and acknowledges a message
// only after its unit committed (a duplicate too):
//
//	src, err := natstransport.NewSource(cons, natstransport.SourceConfig{})
//	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
//		return saveInvoice(ctx, d.Payload) // in the inbox's unit of work
//	}, inbox.ConsumerConfig{})
//	err = c.Run(ctx) // until ctx is done; then finishes the message in progress
//
// A broker that pushes messages and settles them by the handler's error (Watermill's
// router) calls [Inbox.Handle], the consumer's step for one delivery, instead.
//
// # Semantics
//
//   - Once per consumer name within the retention window: a key is recorded in the
//     same transaction as the function's writes, so a crash at any point either
//     leaves both or neither. A redelivery while the key is kept is a duplicate; two
//     consumers racing on one key (two processes after a rebalance) apply it once:
//     on SQL the second waits on the first's row lock and then finds the key; on
//     memory and DynamoDB the check is atomic with the commit, so the loser's
//     function may have run but its writes are discarded.
//   - The key is the message's [outbox.HeaderIdempotencyKey] header (the transports
//     stamp the message id there unless the application set its own), else its
//     [outbox.HeaderMessageID], else [Config.KeyFunc]. Keys longer than
//     [MaxKeyLength] bytes or not valid UTF-8 are stored as their SHA-256.
//   - A duplicate is not an error: [Inbox.Process] returns a [Result] whose Duplicate
//     is true and a nil error, so a consumer loop that acknowledges on a nil error
//     never redelivers a duplicate forever. [ErrDuplicate] is what stores return to
//     the inbox.
//   - A function that fails or panics records nothing: the next delivery runs it
//     again. The function's error is returned as is.
//   - Keys are kept for [Config.Retention] (7 days by default) and then removed:
//     by [Inbox.RemoveExpired] in bounded batches on SQL and memory, by DynamoDB's
//     TTL on DynamoDB. An expired key that is not removed yet still counts.
//   - Process inside an open unit of work of the same store runs as a savepoint of it:
//     the key commits with the outer unit, and a failed fn undoes only its own part. A key that a racing unit records before the outer unit
//     commits then fails the outer unit with the store's error (an error wrapping
//     ErrDuplicate on memory, DynamoDB's cancellation), not a duplicate Result.
//
// # Limitations
//
//   - Only effects written in the unit of work are applied once. A call to another
//     service, an e-mail, a write to another database made by the function may
//     happen again on a redelivery (and happens for a unit that fails to commit).
//   - A message redelivered after its key was removed is applied again: keep the
//     retention longer than any redelivery can take (broker retention, replays,
//     dead-letter redrives).
//   - The inbox does not order messages: delivery order is the broker's and the
//     consume loop's (per partition on Kafka, per group on SQS FIFO).
//   - On DynamoDB a key costs one consistent read (to skip a duplicate's function)
//     and one more item in the unit's TransactWriteItems (so a unit holds at most
//     99 items of its own); on SQL one statement in the transaction.
package inbox
