// Package chaos runs an outbox store through a fleet of dispatchers under faults and
// checks that the outbox's promises hold: nothing committed is lost, nothing rolled
// back is sent, first deliveries of a key follow its commit order, and duplicates are
// the only cost.
//
// A run ([Run]) takes a store the same way the conformance suite does, through an
// [outboxtest.StoreHarness]: a factory for a fresh store and, optionally, a function
// that runs a unit of work on it (by default the store's own
// [outbox.Transactor.Transact]). It then
//
//   - starts Config.Writers writers. Each owns a share of the keys and sends through
//     the real capture ([outbox.NewSender], Transactional mode) inside units of work
//     of one to Config.UnitSize messages; a share of the units is rolled back on
//     purpose after sending. Every message carries its key's sequence number in its
//     payload;
//   - starts Config.Relays dispatchers on the store, each publishing through its own
//     [outboxtest.FaultTransport] into one shared [outboxtest.Recorder];
//   - injects the faults of the [Schedule]: transient message and batch errors,
//     latency, a broker outage, graceful relay stops and restarts, relay crashes
//     (the worker is stopped without releasing its leases, which then have to lapse),
//     and the clock of one relay set back;
//   - ends the faults, restarts the crashed relays under new IDs, and waits for the
//     backlog to drain;
//   - checks the deliveries and returns a [Report].
//
// # Semantics
//
//   - The run fails the test when a committed message was never delivered, a rolled
//     back message was delivered, a key's first deliveries left commit order, the
//     store still holds a pending or parked message after the drain, a unit of work
//     failed for a reason other than the deliberate rollback, or a dispatcher
//     stopped on its own. Duplicates are counted and reported, never failed.
//   - Commit order per key is well defined because each key has exactly one writer,
//     which writes its units one after another.
//   - A crash is simulated in process: [relay.Relay.Kill] cancels in-flight
//     work and leaves the leases to lapse, as a killed process would. A publish in
//     flight at that moment still reaches the broker but is never acknowledged to the
//     relay, so the bucket's next owner publishes it again: that is a counted
//     duplicate. A graceful stop is [relay.Relay.Stop], which hands the
//     leases back.
//   - Drain time is measured from the later of the end of the faults and the last
//     writer's last commit, until every committed message was delivered once.
//
// # Limitations
//
//   - A run happens in one process: it proves the dispatcher's and the store's logic,
//     not the operating system's. Killing real relay processes is a separate test.
//   - Faults on the store itself (lost connections, refused statements) are not
//     injected: they are the store adapter's own tests' business.
//   - Timings are scaled down (leases of a second or two); on a heavily loaded
//     machine a relay can miss its lease, which is a fault the run tolerates but
//     which makes its figures noisier.
//   - The Recorder keeps every delivered message: a run of a few hundred thousand
//     messages needs a few hundred megabytes.
package chaos
