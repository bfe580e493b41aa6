// Package dynamostore is the DynamoDB outbox store: messages, sequence counters,
// leases and relay heartbeats in one table with a string partition key and a string
// sort key, through an AWS SDK v2 client the caller built. Its import path ends in
// store/dynamostore; its name differs from the SDK's service/dynamodb so that both can be
// imported side by side.
//
// Writers put messages in the transaction that carries their business write. The
// unit of work is [Store.Transact]: inside its function, [AddItems] adds the
// application's own TransactWriteItem values, and every send made with the
// function's ctx is staged; when the function returns nil, all of it is written in
// ONE TransactWriteItems request. A Transact inside another on the same store is a
// savepoint: when its function fails, its items and its sends are dropped and the
// outer unit goes on. An application that builds its own request sends on an
// [outbox.NewScope] scope and appends the items [Store.CreateTransactWriteItems]
// makes of the staged messages to it instead. [Store.Enqueue] writes messages that
// have no business write.
//
// Relays ([github.com/outboxkit/outbox/relay]), the inbox, the stream handler
// (package dynamostreams) and the tools take the store itself and reach its relay
// side through [Store.Driver]: a [driver.Store] that also implements [driver.Admin],
// [driver.Notifier], [driver.Prober] and [driver.BacklogSampler]. Relays drain the
// buckets through it and share them with the lease protocol; applications do not
// call it.
//
// # Item schema
//
// Every item lives under Config.KeyPrefix (default OUTBOX); PK and SK stand for the
// configured key attribute names. {bucket} is the decimal bucket number, unpadded.
// Times are UTC ticks: 100 ns units since 0001-01-01T00:00:00Z, as a number.
//
//	item              PK                          SK
//	message           OUTBOX#MESSAGES#{bucket}    sequence, 19 digits, zero padded
//	parked message    OUTBOX#PARKED#{bucket}      its sequence, unchanged
//	sequence counter  OUTBOX#SEQUENCE#{bucket}    SEQUENCE
//	lease             OUTBOX#COORDINATION         LEASE#{bucket, 10 digits, zero padded}
//	relay heartbeat   OUTBOX#COORDINATION         RELAY#{relay id}
//
// A message item holds MessageId (S, the UUID), Topic (S), Key (B; absent: keyless,
// empty: a real empty key), Value (B; absent: tombstone), Headers (B, see
// [driver.EncodeHeaders]), Partition (N, optional), CreatedAtUtc (N, ticks) and BucketCount (N,
// the writer's count). This store adds three attributes written only after a failed
// publish — Attempts (N), NextAttemptAtUtc (N, ticks) and LastError (S, at most 2 KB) —
// and ParkedAtUtc (N, ticks) on parked items. An absent attribute means zero. The
// counter holds Sequence (N), the last number handed out. A lease holds Owner (S,
// absent when free) and ExpiresAtUtc (N). A heartbeat holds LastSeenUtc (N),
// BucketCount (N, the relay's bucket count as of that heartbeat; absent, read as 0,
// on records written before relays stored it) and, once the relay stopped
// gracefully, StoppedAtUtc (N).
//
// # Semantics
//
//   - Unit of work: [Store.Transact] gathers the application's items ([AddItems]) and
//     the staged messages and writes them, application items first, in one
//     TransactWriteItems request when its function returns nil; nothing is sent
//     before. A function that fails or panics writes nothing, whatever the senders'
//     write mode. A nested Transact on the same store is a savepoint: the unit
//     remembers how many items it held, and a nested function that fails or panics
//     drops the items it added and the messages it sent, while one that succeeds
//     keeps them for the outer commit. A unit with nothing to write makes no request;
//     one whose only write is a single message uses a conditional PutItem.
//   - The application's own request: [Store.CreateTransactWriteItems] takes the
//     messages staged on ctx's scope, reserves their sequence numbers and returns
//     their conditional Puts; the scope is empty afterwards, so a rebuilt request
//     sends again. [Store.NotifyCommitted], given the request's items after the
//     commit, wakes this process's relays.
//   - Order: a writer reserves sequence numbers from the bucket's counter with one
//     UpdateItem (ADD) per distinct bucket just before its write (at commit, for a
//     unit of work); messages of one bucket are relayed in sequence order, and
//     messages sharing a bucket within one write keep their send order. A
//     reservation that never commits leaves a harmless gap.
//   - Atomicity: every message Put is conditional on attribute_not_exists, so a
//     transaction never overwrites a pending message (a reset counter fails the
//     transaction instead). A cancelled transaction is returned wrapped: errors.As
//     finds *types.TransactionCanceledException and its CancellationReasons.
//     Enqueue and the unit of work's commit are safe under the SDK's retries: a
//     retry that finds the messages of its own first attempt reports success.
//   - Fetch is a strongly consistent Query in sequence order, followed by gap probing:
//     a Query is only read-committed against TransactWriteItems, so the ranges of
//     missing sequence numbers, lowest first (below the first fetched message down to
//     the last message this store removed, or to the bucket's start after it took the
//     lease; then between fetched messages), are probed with one-range consistent
//     queries, up to eight. The batch is cut before the first gap left unprobed; a
//     probe that finds a message makes Fetch read the head again, at most three reads,
//     and after the last one the batch is cut before the first gap found filled. No
//     message is returned above a gap nobody looked into.
//   - A message item without MessageId, Topic or CreatedAtUtc, or with an attribute
//     that does not decode, is parked by the fetch that reads it, unpublished, with a
//     LastError naming the attribute.
//   - Complete deletes with BatchWriteItem, 25 keys a request; throttled keys are
//     retried with backoff, and those still left are published again later: a
//     duplicate, never a loss.
//   - Parking moves a message into its bucket's parked partition, so fetches never
//     read it again; requeueing moves it back under its original sequence number.
//   - Leases: every lease or heartbeat write is one conditional request. A claim
//     succeeds only on a free or expired lease; renewals and releases are conditional
//     on the owner and expiry the relay holds (the lease's version), so a relay whose
//     lease was taken over cannot renew or release its successor's. Heartbeats only
//     move forward, and lease items beyond the bucket count are ignored. A fleet that
//     agrees on its membership makes no refused conditional write.
//   - Stop: a stopping relay stamps its record StoppedAtUtc instead of deleting it,
//     and moves its LastSeenUtc forward to the latest heartbeat this store sent for
//     it, landed or not, if that is later than the stop: no heartbeat of the run that
//     stopped can land later and clear the stamp, even one dated after the stop
//     because the clock was set back. Only a relay that runs again under the same ID
//     clears it, with its first heartbeat dated after the record. A relay whose
//     Stop context ends first still stamps and releases, for at most
//     min(LeaseDuration, 5 s) more, once its cancelled publishes returned; only if
//     that fails do its leases lapse as after a crash. Peers delete a stopped record
//     a lease duration later, a dead relay's after ten, and one left without
//     LastSeenUtc by an older version at once, conditionally on its still having
//     none.
//   - ReadCoordination is one strongly consistent Query of the coordination
//     partition; ReadRelays, which relays call between rounds, is one eventually
//     consistent Query of its relay items alone (a key condition on the RELAY# sort
//     keys): 0.5 read units for a fleet of up to about 30 relays. Both leave out an
//     item they cannot read (a lease sort key that is not LEASE# and ten digits, a
//     relay item without an id, an attribute of the wrong type) and log it at WARN,
//     once per item for the life of the store; a lease item of a bucket in range
//     that cannot be read counts as free, and the claim that follows repairs it.
//   - Check, which a relay calls when it starts, is one eventually consistent Query
//     of one coordination key; a missing table fails it with
//     [outbox.ErrMisconfigured], naming [CreateIfNotExists].
//   - HasPending is the idle probe ([driver.Prober]) the relay sends before
//     polling a bucket: one eventually consistent one-key query. A bucket whose last
//     fetch left every message pending (a head backing off, the rest behind it or
//     backing off too) is answered no until the earliest due time of all those
//     messages, whatever their key, since the store does not know whether its relay
//     keeps key order: with no request (a full window) or one read of its sequence
//     counter, so another process's commit still counts. A message the fetch
//     returned due behind an earlier one of its key, and that the relay left pending
//     since (held back for key order), counts as due 30 s after that fetch.
//   - Writers need only PutItem and UpdateItem: a retried request's refused put
//     returns the stored item (ReturnValuesOnConditionCheckFailure ALL_OLD), which
//     tells a retry of an applied write from a collision without a read.
//   - The relay side's MessageKey reads a message item's bucket and Seq from its
//     key, for dispatch from the table's stream (package dynamostreams, a module of
//     its own, and [github.com/outboxkit/outbox/relay.Relay.DispatchAt]).
//   - Stats counts pending and parked messages up to PendingCountLimit per bucket
//     and reads each bucket's head for the oldest age; SampleBacklog samples only
//     while this store's relay holds bucket zero.
//   - Commits are announced to subscribers in this process (the relay side's
//     Subscribe, [driver.Notifier]); other processes' relays find them by polling.
//
// # Limitations
//
//   - An accepted message item leaves room under DynamoDB's 400 KB for what a failed
//     publish adds (attempts, next attempt, 2 KB of error text, parking time), so
//     [Store.MaxMessageSize] is about 397 KB and every accepted message can be
//     rescheduled and parked. KeyPrefix is at most 2,028 bytes and a relay id at most
//     1,018 (DynamoDB's key value limits), checked before any request.
//   - One transaction holds at most 100 items and 4 MB, and an item at most 400 KB. A
//     unit of work counts the application's items and its messages together: the
//     commit refuses a unit over a limit before it sends anything, and [AddItems]
//     refuses items as soon as the application's items alone can no longer fit
//     ([outbox.ErrTooLarge]); the items of a nested unit that failed no longer
//     count. Enqueue takes at most [MaxEnqueue] messages. Keep large payloads
//     elsewhere.
//   - Only Put items have a size the store can measure before sending; an Update that
//     would grow an item past 400 KB is refused by DynamoDB at commit.
//   - No retention: completed messages are deleted, so this store does not implement
//     [driver.Retainer] and a relay configured with a retention period is refused
//     with [outbox.ErrMisconfigured].
//   - No lookup by ID ([driver.Finder]): DynamoDB would need an index or a read of
//     every bucket. The relay side's Purge and Requeue pay that read; they are
//     operator tools. Stream dispatch needs no lookup: the record's keys name bucket
//     and Seq.
//   - Message IDs are not checked for uniqueness, for the same reason: a message
//     whose ID ([outbox.Message.ID]) the store already holds is stored again, under
//     its own sequence number, and published twice (consumers deduplicate on the
//     ID, as after any redelivery).
//   - While a head backs off, a message another process commits into a gap inside
//     the last fetched window, or requeues, waits for the earliest due time of what
//     was fetched; a reservation above the window left uncommitted for 30 s counts as
//     abandoned. A relay with Unordered whose drain was cut short (its lease about to
//     lapse) may send a message held behind a backed-off one of its key up to 30 s
//     late.
//   - One bucket is one partition key, which DynamoDB serves at up to 1,000 write
//     units a second; raise the bucket count (after draining the table) for more.
//   - One region: conditional writes in a multi-region global table do not arbitrate
//     between regions.
//   - Lease expiry compares host clocks; keep relay hosts synchronised to well within
//     the lease duration.
package dynamostore
