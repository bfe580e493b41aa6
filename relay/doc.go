// Package relay publishes the messages an outbox store holds to a broker.
//
// A [Relay] runs in every relay process; an application builds one with [New] on
// its store and a transport and runs it with [Relay.Run] (or Start and Stop). Relays share a store's buckets through
// leases: each round a relay writes its heartbeat, reads every lease and heartbeat in
// one consistent read, computes the fleet's fair-share split with a pure function of
// that read, and carries out only its own part of it (renew what it keeps, hand back
// what exceeds its share, claim what the split gives it). For each bucket it holds it
// fetches the head in Seq order, publishes the due envelopes in one
// [driver.Transport.Publish] call, and completes the acknowledged ones in one store
// call; failures are retried with exponential backoff and jitter, then parked.
//
// Three entry points share this engine: the worker ([Relay.Run], or [Relay.Start]
// and [Relay.Stop]) for long-running processes, [Relay.RunOnce] for a scheduled
// function, and [Relay.DispatchOne] for a change-stream trigger. Start (and so Run)
// fails on a store that cannot be relayed from, such as one never migrated, with an
// error wrapping [outbox.ErrMisconfigured]; an error that stops the worker later is
// what Run returns ([Relay.Err]).
// [Relay.Kill] stops the worker as a crash would, for tests.
//
// A store whose messages come as a stream ([driver.Streamer]: the SQL store's log
// mode on PostgreSQL) adds one service to the worker: the relay holding
// [driver.StreamLease] reads the stream, publishes in per-key order through the same
// transport, moves a message that keeps failing (and its key while held) into the
// store's table after [Config.StreamRetryBudget], and confirms the stream only past
// what the broker acknowledged or the table holds. RunOnce and DispatchOne drain the
// table alone.
//
// # Semantics
//
//   - At least once. An envelope is removed (or marked dispatched) only after the
//     broker acknowledged it, so a crash between the two publishes it again. A lease
//     that moves while a batch is in flight, and DispatchOne racing the owner, can
//     also duplicate. Consumers deduplicate on the message-id or idempotency-key
//     header.
//   - Per-key order. A key lives in one bucket and a bucket is published by one relay
//     at a time, in Seq order. A failed envelope holds back the later envelopes of its
//     key that were fetched with it (until its retry succeeds or it is parked); other
//     keys of the bucket keep flowing. Keyless envelopes never hold each other back.
//     One Publish call carries at most one envelope per key, so a failure cannot be
//     overtaken inside a batch — unless the transport implements
//     [driver.KeyOrderKeeper] (it fails a key's whole tail, as the Kafka transport
//     does), and then a call carries a key's envelopes together. With
//     [Config.Unordered] failures retry without holding their key.
//   - A parked envelope is skipped: later envelopes of its key flow on. Parked
//     envelopes are never deleted automatically.
//   - Retries: the n-th failure waits BackoffBase·2^(n-1), capped at BackoffMax, less
//     up to Jitter of it. A failure marked [driver.Permanent] parks at once; the
//     MaxAttempts-th failure parks.
//   - Leases, event by event. Steady state: each relay renews its own leases once per
//     LeaseRenewInterval, conditionally on the expiry it read; nothing is refused. A
//     relay joins: peers hand back their excess on their next round and it claims it
//     on its following round; nothing moves if the split is already fair, and relays
//     beyond the bucket count are standbys (the first BucketCount of them run every
//     round; the rest, when LeaseDuration is at least 8/3 times LeaseRenewInterval,
//     every other round). Graceful stop (Stop, a cancelled Start context, the end of
//     RunOnce): the relay finishes in-flight batches (or cancels them, if Stop's
//     context ended), stamps itself stopped, releases its leases and re-reads, up to
//     five times, until none names it; peers claim the buckets on their next round.
//     Crash (or Kill): its leases lapse after LeaseDuration, and only then do peers
//     split them. Clock set back: the relay
//     sends no renewal that would move an expiry backwards, logs a warning, publishes
//     nothing from those buckets until its clock passes the stored expiry, and claims
//     nothing while its heartbeat is refused. Stall past the lease: a peer takes the
//     lapsed buckets, the stalled relay's renewal is refused and it stops publishing
//     them. A relay publishes from a bucket only while more than half a
//     LeaseRenewInterval remains on its lease. Stopped relay records are deleted one
//     LeaseDuration after they stopped, dead ones after ten.
//   - Refused conditional writes are counted ([Stats.RefusedWrites]); a healthy fleet
//     in steady state makes none.
//   - Metrics: every publish, completion, retry, park, retention delete, refused
//     write, round and backlog sample is reported to [Config.Observer] as it happens
//     (package outboxotel turns them into OpenTelemetry instruments); without one
//     nothing is measured beyond [Stats]. The worker holding bucket 0 samples the
//     backlog every [Config.BacklogInterval] ([Stats.Backlog]); [Relay.Ready]
//     tells a readiness probe whether the relay holds its share.
//   - An envelope stamped with another bucket count stops the worker with an error
//     wrapping [outbox.ErrMisconfigured] ([Relay.Err], returned by [Relay.Run]).
//   - Wake-ups: with a store that implements [driver.Notifier] the worker drains a
//     bucket it holds as soon as a commit is announced; otherwise it polls every
//     PollInterval. A poll first asks a store that implements [driver.Prober]
//     whether the bucket may hold anything, so an idle bucket costs one minimal read.
//     Store errors back the worker off (up to LeaseRenewInterval) and it recovers by
//     itself. Every store call has a deadline, [Config.StoreTimeout]
//     (LeaseRenewInterval unless set); a relay whose claims fail three rounds in a
//     row (a slow link whose writes keep missing it) stamps itself stopped, hands its
//     share to its peers for a LeaseDuration, and rejoins.
//   - Logging, through [Config.Logger]: a failed publish that will be retried is a
//     WARN at most once per bucket per LeaseRenewInterval, with topic, message id,
//     attempts, next attempt and cause; the failures in between are DEBUG, and the
//     next WARN says how many there were (suppressed). The stream reader's writes to
//     the table lane are a WARN at most once per LeaseRenewInterval too, the rest
//     DEBUG. A parked message is always a WARN. The worker stopping on its own
//     (bucket count mismatch, closed store) is an ERROR, as is another live process
//     found running under this relay's ID (both processes log it, naming both
//     instances; [Stats.InstanceClashes] counts it); store errors, refused renewals,
//     clock trouble and failed releases are WARNs. Nothing is logged per successful
//     publish.
//
// # Inside
//
// A relay is a few services over one lease table (the leases it holds, one drain lock
// per bucket): the coordinator runs the rounds (the pure planner, planRound, computes
// each relay's part from one view), the drainer selects what is due, publishes it in
// waves and settles every outcome, and the backlog and retention samplers run while
// the relay holds bucket 0. The worker runs the coordinator and the drainer side by
// side on one start/stop primitive; RunOnce and DispatchOne call the same services
// directly.
//
// # Limitations
//
//   - Ordering holds within the fetched window: if a blocked key's envelopes fill a
//     whole batch, later keys of that bucket wait until the blocked envelope is
//     retried or parked. Raise BatchSize if a few keys dominate a bucket.
//   - Through a transport that does not implement [driver.KeyOrderKeeper], a key
//     sends at most one envelope per Publish call, so a backlog concentrated on a
//     single key drains at one round trip per envelope.
//   - Lease expiry compares host clocks: keep relay hosts synchronised to well within
//     LeaseDuration − LeaseRenewInterval.
//   - Rounds run on their own clock beside the drains, so a slow publish does not delay
//     a renewal; but a publish never outlives its bucket's lease: it is abandoned when
//     the lease lapses, and counts as an attempt (a message that can never be
//     published within a lease parks after MaxAttempts). A transport that says how
//     long it may wait for the broker ([driver.PublishTimeouter]) must fit in
//     LeaseDuration − LeaseRenewInterval, or [New] refuses the timings.
//   - DispatchOne without a running worker claims a free bucket outside the
//     fair-share plan for the length of one drain; racing a peer's round this can
//     cost a refused write. It does nothing for a bucket another relay holds, so a
//     stream trigger needs a sweep (RunOnce or a worker) behind it for retries.
//   - RunOnce relays do not keep a membership between runs; mixing them with
//     long-running workers on one store makes the workers hand back buckets that the
//     scheduled relay is no longer there to take.
package relay
