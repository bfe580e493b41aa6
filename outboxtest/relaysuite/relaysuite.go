// Package relaysuite runs a transport under a real relay, against its real broker:
// messages are written through a store, relayed by a [relay.Relay] (its worker, Run,
// or RunOnce sweeps) and read back from the broker. Every transport's tests run
// [Run]; its benchmarks run [Benchmark].
//
// A [Harness] says how to make the transport and read what reached the broker, and
// its [Features] say what the transport can do: a subtest that needs a feature the
// transport lacks is skipped, and says which.
//
// The suite lives beside package outboxtest rather than in it because it builds
// relays, and the relay package's own tests import outboxtest.
package relaysuite

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// Buckets is the bucket count of every store and relay the suite makes
// ([driver.DefaultBucketCount]). A harness whose broker places keys by bucket (Kafka
// partitions) can make its topics with as many places, and check where each message
// landed in Read.
const Buckets = driver.DefaultBucketCount

// Harness adapts one transport to [Run] and [Benchmark].
type Harness struct {
	// New returns a transport that publishes to topic. The first call for a topic
	// creates it empty (a topic, stream or queue of the test's own, removed at
	// cleanup); a later call for the same topic returns another transport, on a client
	// of its own, that publishes to the same one.
	//
	// When dial is not nil the transport must reach the broker only through it:
	// wherever its client would connect to a broker address (host:port), it connects
	// to dial(address) instead, where the suite has put a fault proxy. dial may be
	// called at any time, from the client's own goroutines. New is called with a nil
	// dial unless Features.Proxy is set.
	//
	// Give a transport made with dial timeouts that end a publish on a dead
	// connection within a second or two, well inside the outage subtests' 6 s lease:
	// a publish that outlasts its lease is abandoned and counts against the
	// message's attempts as a failure of the message, not of the broker. In those
	// subtests the relay also spends its messages' attempts while cut off, and once
	// the broker answers again one more failure of such a message parks it, so the
	// timeouts must be long enough that a healthy broker never runs into them on a
	// busy machine.
	New func(tb testing.TB, topic string, dial func(addr string) string) driver.Transport
	// Read returns the next n messages that arrived on topic, in arrival order,
	// failing the test if they do not arrive in reasonable time, as
	// [outboxtest.TransportHarness] Read does. The suite never asks for more messages
	// than were published.
	Read func(tb testing.TB, topic string, n int) []outboxtest.Received
	// Raw, optional, is the baseline of [Benchmark]'s publish rounds: given a
	// transport New made (with a nil dial), it returns a function that does with the
	// broker's own client what the transport's Publish does for a batch (the same
	// records to the batch's topic, the same acknowledgements, no outbox
	// bookkeeping). It may reach the transport's client through the transport's As
	// method, so that both sides share it. Without Raw the rounds time the transport
	// alone.
	Raw func(tb testing.TB, tr driver.Transport) func(ctx context.Context, batch []*driver.Envelope) error
	// Store, optional, returns an empty store with bucketCount buckets for the relays
	// to drain; the suite closes it. Defaults to a memory store (package memstore).
	Store func(tb testing.TB, bucketCount int) outboxtest.Store
	// Source, optional, returns a source that receives what arrives on topic from
	// its start, under a consumer (group, durable consumer, queue) of its own: the
	// transport's NewSource on a client of the harness's. It is first called after New
	// made the topic and before anything is published to it. It may be called again
	// for the topic once the consumer of the last source it returned stopped: the new
	// source is that same consumer's (as after a restart), receives what the earlier
	// one left unacknowledged, and the harness may let go of the earlier one's client.
	// Without it the Consume subtests are skipped.
	Source func(tb testing.TB, topic string) inbox.Source
	// Foreign, optional, writes to topic a message the outbox did not write (no
	// message ID, no inbox key), which the Consume subtest's consumer must settle
	// without applying.
	Foreign func(tb testing.TB, topic string)
	// Settled, optional, fails tb unless the broker holds nothing unacknowledged (or
	// uncommitted) for the consumer of the sources Source made for topic, once its
	// last one stopped: foreign messages (Foreign) the broker keeps for a redrive
	// policy aside.
	Settled func(tb testing.TB, topic string)
	// Features says what the transport can do.
	Features Features
}

// Features says what a transport can do. The zero value promises nothing beyond
// delivery at least once: the order and outage subtests are skipped.
type Features struct {
	// Ordered reports that the first delivery of each message of a key arrives in the
	// key's commit order, through failed publishes, retries and outages, as the relay
	// publishes them. The suite then checks that order in every subtest. Leave it
	// false where a broker or mode keeps order only while nothing fails.
	Ordered bool
	// Deduplicates reports that the broker drops a message whose ID it already holds
	// (a duplicate window, FIFO deduplication), so a message published twice arrives
	// once. Otherwise the redelivery subtest checks that a message whose
	// acknowledgement was lost arrives a second time.
	Deduplicates bool
	// Proxy reports that New honours its dial argument, so the outage subtests run:
	// the broker connection cut mid-run and healed, black-holed (held open,
	// forwarding nothing), and a cut-off relay handing its buckets to a peer (for a
	// [driver.Pinger]). The transport's client must notice within seconds a
	// connection that forwards nothing (request timeouts, heartbeats) and open
	// another.
	Proxy bool
	// ReconnectRaces reports that the broker's client itself, not the transport, has
	// a data race that the race detector reports while it reconnects. The outage
	// subtests are then skipped in builds with -race, and run without it.
	ReconnectRaces bool
	// ReconnectBackoff reports that the broker's client waits out a backoff of its
	// own before it reconnects once a connection healed (Kafka's producer), so the
	// first publish after the heal may still fail transiently. The Outage/Call
	// subtest then retries until one succeeds; otherwise the first retry must
	// (after Ping answers, for a [driver.Pinger]).
	ReconnectBackoff bool

	// Pinger, KeepsKeyOrder, SizeLimiter and PublishTimeouter declare the optional
	// interfaces of package driver that the transport New returns implements, which
	// relays and senders find by type assertion, so that a method whose signature
	// drifted would drop the capability silently. The Capabilities subtest fails
	// unless the transport implements exactly the ones declared, and the subtests
	// that need a Pinger or a key-order keeper go by the declaration: this is where
	// each transport's implementation of them is asserted.

	// Pinger declares a [driver.Pinger].
	Pinger bool
	// KeepsKeyOrder declares a [driver.KeyOrderKeeper] whose KeepsKeyOrder reports
	// true for the transport New returns. (A keeper that reports false is not
	// declared: the relay takes it for none.)
	KeepsKeyOrder bool
	// SizeLimiter declares a [driver.SizeLimiter].
	SizeLimiter bool
	// PublishTimeouter declares a [driver.PublishTimeouter].
	PublishTimeouter bool

	// IdempotencyKey reports that the transport stamps an
	// [outbox.HeaderIdempotencyKey] header equal to the message ID on every message
	// the application gave none (the default of every transport of this
	// repository). The suite then requires it on every delivery.
	IdempotencyKey bool
	// HeadersAtLimit is how many application headers of a few bytes a message of
	// the transport's MaxMessageSize may carry and still be published: the framing
	// its limit always leaves room for (28 on Kafka, 32 on SQS). The SizeLimit
	// subtests publish a message at the limit with a key and that many headers.
	HeadersAtLimit int
	// EmptyIsNil reports that the broker cannot tell an empty key or payload from a
	// nil one, as [outboxtest.TransportHarness] EmptyIsNil does.
	EmptyIsNil bool
}

// Run runs the relay suite against the transport h makes:
//
//   - Capabilities: the transport implements the optional interfaces
//     Features declares (Pinger, KeepsKeyOrder, SizeLimiter, PublishTimeouter), and
//     no other.
//   - Transport: the conformance suite of package outboxtest
//     ([outboxtest.RunTransportTests]) on the transports New makes: bytes pass
//     through unchanged, an empty batch, a large batch in one call, a per-message
//     failure (Features.SizeLimiter), a key's order where nothing fails
//     (Features.Ordered or KeepsKeyOrder, whose relay hands a key's messages over in
//     order in one call), a cancelled context.
//   - RelaysEveryMessage: a backlog written in units of work through the store is
//     relayed by a worker (Relay.Run) and every message arrives once acknowledged:
//     ID, key, payload and headers intact (the idempotency key stamped, with
//     Features.IdempotencyKey), per-key order kept (Features.Ordered), nothing
//     parked, each message acknowledged once.
//   - Redelivery: publishes fail before anything is sent, fail for one key's
//     messages, or reach the broker and lose their acknowledgement; every message
//     is published again until acknowledged, nothing is lost, nothing parked, and
//     a message whose acknowledgement was lost arrives again (unless the broker
//     deduplicates). Once with the relay putting a key's messages in one call
//     (Features.KeepsKeyOrder) under a worker, once with one message per key per
//     call under RunOnce sweeps.
//   - Outage (Features.Proxy): the proxy between relay and broker cuts every
//     connection and refuses new ones while messages are relayed (with
//     Features.Pinger, past a lease: the relay steps aside), then heals; or it
//     black-holes the open connections. Messages written before, during and after
//     all arrive, nothing is parked, key order holds. CutOffParksNothing
//     (Features.Pinger): a cut that outlasts a message's attempts and a lease parks
//     nothing, and a relay started once the proxy heals delivers everything. Call:
//     one Publish call during a cut fails, transiently, claiming nothing sent, and
//     Ping fails (Features.Pinger); once the proxy heals Ping answers, the first
//     retry (with Features.ReconnectBackoff, one after the client's backoff) and
//     the next call succeed, and every message is on the broker once.
//   - CutOffRelayHandsOver (Features.Proxy and Features.Pinger): of two relays on
//     one store, the one whose broker connection is cut hands its buckets to the
//     other, which delivers everything; nothing is parked; the first takes its share
//     back once the proxy heals.
//   - PingHonoursContext (Features.Pinger): a Ping with an ended context returns
//     the context's error.
//   - SizeLimit (Features.SizeLimiter, with a positive limit): AtTheLimit, a message
//     whose Size is exactly the limit arrives intact, whatever its shape (binary or
//     text payload, a key and Features.HeadersAtLimit headers), and one byte more
//     fails alone, permanently, with [outbox.ErrTooLarge], the rest of its batch
//     delivered; HoldsBackItsKey (Features.KeepsKeyOrder), the refused message's
//     later messages of its key fail transiently and the others go;
//     Capture, wired through outbox.SenderConfig.Transport, capture refuses a message
//     over the limit before writing it, takes one at the limit, which is relayed and
//     delivered, and without the wiring the relay parks an oversized one at once.
//   - Consume (Harness.Source): EachOnce, keyed messages, a copy of one and a
//     message the outbox did not write are consumed through the transport's source
//     by an [inbox.Consumer] whose handler refuses one message twice: each message
//     is applied once, in its key's order (Features.Ordered), the copy is a
//     duplicate (unless the broker deduplicates), and nothing is left
//     unacknowledged (Harness.Settled). StopsGracefully, a consumer stopped while a
//     delivery is in its handler waits for it, starts no other, and returns nil
//     once it is acknowledged; a consumer on a fresh source then gets exactly what
//     the first did not apply.
//
// Messages whose attempts an outage spent park on their next failure once the
// broker answers again, so the outage subtests other than CutOffParksNothing allow a
// thousand attempts: they check delivery and recovery, CutOffParksNothing checks the
// attempts.
//
// Every subtest makes topics of its own through h.New and runs in parallel with the
// others.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.NotNil(t, h.New, "Harness.New is required")
	require.NotNil(t, h.Read, "Harness.Read is required")
	s := suite{h: h}
	group(t, map[string]func(*testing.T){
		"Capabilities":       s.capabilities,
		"Transport":          s.transport,
		"RelaysEveryMessage": s.relaysEveryMessage,
		"Redelivery": func(t *testing.T) {
			group(t, map[string]func(*testing.T){
				"KeysTogether":     func(t *testing.T) { s.redelivery(t, true) },
				"OneMessagePerKey": func(t *testing.T) { s.redelivery(t, false) },
			})
		},
		"Outage": func(t *testing.T) {
			group(t, map[string]func(*testing.T){
				"Cut":                func(t *testing.T) { s.outage(t, false) },
				"Blackhole":          func(t *testing.T) { s.outage(t, true) },
				"CutOffParksNothing": s.cutOffParksNothing,
				"Call":               s.outageCall,
			})
		},
		"CutOffRelayHandsOver": s.cutOffRelayHandsOver,
		"PingHonoursContext":   s.pingHonoursContext,
		"SizeLimit": func(t *testing.T) {
			group(t, map[string]func(*testing.T){
				"AtTheLimit":      s.atTheLimit,
				"HoldsBackItsKey": s.holdsBackItsKey,
				"Capture":         s.captureRefuses,
			})
		},
		"Consume": func(t *testing.T) {
			group(t, map[string]func(*testing.T){
				"EachOnce":        s.consume,
				"StopsGracefully": s.consumeStopsGracefully,
			})
		},
	})
}

// group runs the subtests of one group in parallel.
func group(t *testing.T, tests map[string]func(*testing.T)) {
	for name, run := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			run(t)
		})
	}
}

type suite struct{ h Harness }

// capabilities checks Features' declarations against the transport New returns.
func (s suite) capabilities(t *testing.T) {
	tr := s.h.New(t, topicName("capabilities"), nil)
	f := s.h.Features
	_, pinger := tr.(driver.Pinger)
	k, keeper := tr.(driver.KeyOrderKeeper)
	keeps := keeper && k.KeepsKeyOrder()
	_, limiter := tr.(driver.SizeLimiter)
	_, timeouter := tr.(driver.PublishTimeouter)
	assert.Equal(t, f.Pinger, pinger, "Features.Pinger is %t: the transport %s a driver.Pinger", f.Pinger, is(pinger))
	assert.Equal(t, f.KeepsKeyOrder, keeps, "Features.KeepsKeyOrder is %t: the transport %s a driver.KeyOrderKeeper whose KeepsKeyOrder reports true", f.KeepsKeyOrder, is(keeps))
	assert.Equal(t, f.SizeLimiter, limiter, "Features.SizeLimiter is %t: the transport %s a driver.SizeLimiter", f.SizeLimiter, is(limiter))
	assert.Equal(t, f.PublishTimeouter, timeouter, "Features.PublishTimeouter is %t: the transport %s a driver.PublishTimeouter", f.PublishTimeouter, is(timeouter))
}

func is(ok bool) string {
	if ok {
		return "is"
	}
	return "is not"
}

// within bounds every wait of the suite: generous, so a busy machine passes.
const within = 2 * time.Minute

// callTimeout bounds the suite's own store calls and a relay's graceful stop.
const callTimeout = 30 * time.Second

func topicName(prefix string) string {
	return fmt.Sprintf("outbox-relay-%s-%s", prefix, uuid.NewString()[:8])
}

// store returns an empty store with [Buckets] buckets, closed at cleanup.
func (s suite) store(tb testing.TB) outboxtest.Store {
	tb.Helper()
	var st outboxtest.Store
	if s.h.Store != nil {
		st = s.h.Store(tb, Buckets)
	} else {
		m, err := memstore.New(memstore.Config{BucketCount: Buckets})
		require.NoError(tb, err)
		st = m
	}
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

// config is a relay configuration with quick polls and retries, transient failures
// never parking, and the relay's default 30 s lease.
func config(name string) relay.Config {
	return relay.Config{
		RelayID:         name + "-" + uuid.NewString()[:8],
		BucketCount:     Buckets,
		BatchSize:       50,
		PollInterval:    10 * time.Millisecond,
		BackoffBase:     time.Millisecond,
		BackoffMax:      20 * time.Millisecond,
		MaxAttempts:     1000,
		Jitter:          -1,
		BacklogInterval: -1,
		Logger:          slog.New(slog.DiscardHandler),
	}
}

// shortLease gives cfg a 6 s lease renewed every 2 s, so a relay cut off from its
// broker steps aside within the test, while a round or a publish that is late on a
// busy machine still finishes well inside the lease.
func shortLease(cfg relay.Config) relay.Config {
	cfg.LeaseDuration = 6 * time.Second
	cfg.LeaseRenewInterval = 2 * time.Second
	return cfg
}

func newRelay(tb testing.TB, st outboxtest.Store, tr driver.Transport, cfg relay.Config) *relay.Relay {
	tb.Helper()
	d, err := relay.New(st, tr, cfg)
	require.NoError(tb, err)
	return d
}

// start starts d's worker, stopped gracefully at cleanup.
func start(t *testing.T, d *relay.Relay) {
	t.Helper()
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_ = d.Stop(ctx)
	})
}

func stop(t *testing.T, d *relay.Relay) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	require.NoError(t, d.Stop(ctx))
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle waits until d has completed or parked n messages, and fails if it parked
// any.
func settle(t *testing.T, d *relay.Relay, n int) {
	t.Helper()
	waitFor(t, "the relay to complete every message", func() bool {
		stats := d.Stats()
		return stats.Published+stats.Parked >= int64(n)
	})
	require.Zero(t, d.Stats().Parked, "the relay parked messages")
}

// requireNothingParked checks the relays' counters and, when the store lists them,
// the store itself.
func requireNothingParked(t *testing.T, st outboxtest.Store, ds ...*relay.Relay) {
	t.Helper()
	for i, d := range ds {
		stats := d.Stats()
		require.Zero(t, stats.Parked, "relay %d parked messages", i)
		require.Zero(t, stats.OutOfOrder, "relay %d saw a message acknowledged after an earlier one of its key failed in the same call", i)
	}
	if admin, ok := st.Driver().(driver.Admin); ok {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		parked, err := admin.List(ctx, driver.Parked, driver.Cursor{}, 10)
		require.NoError(t, err)
		require.Empty(t, parked, "the store holds parked messages")
	}
}

func (s suite) relaysEveryMessage(t *testing.T) {
	const n = 200
	topic := topicName("e2e")
	tr := s.h.New(t, topic, nil)
	st := s.store(t)
	w := newWriter(t, st, topic, 10)
	w.write(t, n)

	d := newRelay(t, st, tr, config("e2e"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()

	settle(t, d, n)
	r := newReader(s.h, w)
	r.awaitAll(t, nil)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "Run returns nil once its context ends")
	case <-time.After(callTimeout):
		t.Fatal("Run did not return after its context ended")
	}

	stats := d.Stats()
	require.Equal(t, int64(n), stats.Published, "each message is acknowledged once")
	requireNothingParked(t, st, d)
	s.checkOrder(t, r)
}

// redelivery relays through faults injected above the real transport: a worker with
// a key's messages together in one call, or RunOnce sweeps with one message per key
// per call.
func (s suite) redelivery(t *testing.T, together bool) {
	const n = 200
	if together && !s.h.Features.KeepsKeyOrder {
		t.Skip("Features.KeepsKeyOrder is not set: the relay never puts two messages of a key in one call")
	}
	topic := topicName("redelivery")
	tr := s.h.New(t, topic, nil)
	f := newFaulty(tr, together)
	st := s.store(t)
	w := newWriter(t, st, topic, 5)
	w.write(t, n)
	d := newRelay(t, st, f, config("redelivery"))

	if together {
		start(t, d)
		settle(t, d, n)
		stop(t, d)
	} else {
		// Every sweep publishes what is due; a failure is due again after at most
		// BackoffMax. A sweep's calls fail at most three times in four, so a few
		// sweeps per message bound the run.
		ctx := context.Background()
		for sweep := 0; d.Stats().Published < n; sweep++ {
			require.Less(t, sweep, 4*n, "the sweeps complete every message")
			_, err := d.RunOnce(ctx)
			require.NoError(t, err)
			time.Sleep(20 * time.Millisecond) // the longest backoff
		}
	}
	require.Equal(t, int64(n), d.Stats().Published, "each message is completed once")
	require.Positive(t, d.Stats().Retried, "the injected failures were retried")
	requireNothingParked(t, st, d)

	lost := f.lostAcks()
	require.NotEmpty(t, lost, "some acknowledgements were lost")
	require.Positive(t, f.refused(), "some publishes were refused")
	for id := range lost {
		require.GreaterOrEqual(t, f.acked(id), 2, "message %s, whose acknowledgement was lost, is published again", id)
	}
	want := map[uuid.UUID]int{}
	if !s.h.Features.Deduplicates {
		for id := range lost {
			want[id] = 2
		}
	}
	r := newReader(s.h, w)
	r.awaitAll(t, want)
	s.checkOrder(t, r)
}

// outage relays through a fault proxy that cuts every connection and refuses new
// ones for a while (or black-holes the open ones) while messages are relayed.
func (s suite) outage(t *testing.T, blackhole bool) {
	s.needProxy(t)
	px := newProxies(t)
	topic := topicName("outage")
	tr := s.h.New(t, topic, px.dial)
	pinger := s.h.Features.Pinger
	cfg := shortLease(config("outage"))
	st := s.store(t)
	w := newWriter(t, st, topic, 10)
	w.write(t, 300)
	d := newRelay(t, st, tr, cfg)
	start(t, d)

	waitFor(t, "the relay to publish", func() bool { return d.Stats().Published > 0 })
	px.require(t)
	retried := d.Stats().Retried
	if blackhole {
		px.blackhole()
		w.write(t, 100)
		// The publishes on the held connections fail; the client opens new ones,
		// which the proxy lets through.
		waitFor(t, "a publish on a black-holed connection to fail", func() bool { return d.Stats().Retried > retried })
	} else {
		px.cut()
		cutAt := time.Now()
		w.write(t, 100)
		// With a Pinger the cut outlasts a lease, so the relay steps aside, and
		// rejoins once the proxy heals.
		waitFor(t, "the relay to fail during the outage", func() bool {
			return d.Stats().Retried >= retried+10 && (!pinger || time.Since(cutAt) > cfg.LeaseDuration+time.Second)
		})
		require.Zero(t, d.Stats().Parked, "nothing is parked for an outage")
		px.restore()
	}
	w.write(t, 100)

	settle(t, d, w.len())
	r := newReader(s.h, w)
	r.awaitAll(t, nil)
	stop(t, d)
	requireNothingParked(t, st, d)
	s.checkOrder(t, r)
	t.Logf("published %d, retried %d, deliveries %d for %d messages", d.Stats().Published, d.Stats().Retried, len(r.all), w.len())
}

// cutOffParksNothing cuts a relay off from its broker for longer than its messages'
// attempts and a lease: a relay that can ping its broker parks none of them. The
// relay is stopped before the proxy heals (once the broker answers, the next failure
// of a message whose attempts the cut spent parks it, as any failure that runs out
// of attempts does); a second relay then delivers everything.
func (s suite) cutOffParksNothing(t *testing.T) {
	s.needProxy(t)
	if !s.h.Features.Pinger {
		t.Skip("Features.Pinger is not set: a relay cannot tell a lost broker from failing messages, and parks what runs out of attempts")
	}
	px := newProxies(t)
	topic := topicName("parks-nothing")
	tr := s.h.New(t, topic, px.dial)
	cfg := shortLease(config("cut-off"))
	cfg.MaxAttempts = 2
	st := s.store(t)
	w := newWriter(t, st, topic, 10)
	w.write(t, 100)
	d := newRelay(t, st, tr, cfg)
	start(t, d)
	waitFor(t, "the relay to publish", func() bool { return d.Stats().Published > 0 })
	px.require(t)

	px.cut()
	cutAt := time.Now()
	w.write(t, 100)
	spent := func() bool { return true }
	if admin, ok := st.Driver().(driver.Admin); ok {
		spent = func() bool { return maxAttempts(t, admin) >= cfg.MaxAttempts }
	}
	waitFor(t, "the cut to outlast a message's attempts and a lease", func() bool {
		if d.Stats().Parked > 0 {
			return true // what the next check reports
		}
		return d.Stats().Retried >= int64(2*cfg.MaxAttempts) && time.Since(cutAt) > cfg.LeaseDuration+time.Second && spent()
	})
	stop(t, d)
	requireNothingParked(t, st, d)

	px.restore()
	d2 := newRelay(t, st, tr, shortLease(config("after")))
	start(t, d2)
	settle(t, d2, w.len()-int(d.Stats().Published))
	r := newReader(s.h, w)
	r.awaitAll(t, nil)
	stop(t, d2)
	requireNothingParked(t, st, d, d2)
	s.checkOrder(t, r)
}

// maxAttempts is the most attempts a pending message of the store has made.
func maxAttempts(t *testing.T, admin driver.Admin) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	most := 0
	var after driver.Cursor
	for {
		envs, err := admin.List(ctx, driver.Pending, after, 500)
		require.NoError(t, err)
		for _, e := range envs {
			most = max(most, e.Attempts)
		}
		if len(envs) < 500 {
			return most
		}
		after = driver.After(envs[len(envs)-1])
	}
}

// cutOffRelayHandsOver runs two relays on one store, one reaching the broker through
// the proxy, the other directly, and cuts the first off.
func (s suite) cutOffRelayHandsOver(t *testing.T) {
	s.needProxy(t)
	if !s.h.Features.Pinger {
		t.Skip("Features.Pinger is not set: a relay cannot tell a lost broker from failing messages")
	}
	px := newProxies(t)
	topic := topicName("handover")
	cutTr := s.h.New(t, topic, px.dial)
	goodTr := s.h.New(t, topic, nil)
	st := s.store(t)
	w := newWriter(t, st, topic, 16)
	cfg := func(name string) relay.Config {
		c := shortLease(config(name))
		c.BackoffBase, c.BackoffMax = 50*time.Millisecond, 200*time.Millisecond
		return c
	}
	a := newRelay(t, st, cutTr, cfg("cut-off"))
	b := newRelay(t, st, goodTr, cfg("peer"))
	start(t, a)
	start(t, b)
	waitFor(t, "both relays to publish", func() bool {
		w.write(t, 8)
		time.Sleep(100 * time.Millisecond)
		return a.Stats().Published > 0 && b.Stats().Published > 0
	})
	r := newReader(s.h, w)
	r.awaitAll(t, nil)
	px.require(t)

	px.cut()
	retried := a.Stats().Retried
	w.write(t, 48)
	waitFor(t, "the cut-off relay to fail", func() bool { return a.Stats().Retried > retried })
	r.awaitAll(t, nil) // through the peer only
	require.Zero(t, a.Stats().Parked+b.Stats().Parked, "nothing is parked for an outage")
	require.NoError(t, a.Err())

	px.restore()
	published := a.Stats().Published
	waitFor(t, "the cut-off relay to publish again", func() bool {
		w.write(t, 8)
		time.Sleep(100 * time.Millisecond)
		return a.Stats().Published > published
	})
	r.awaitAll(t, nil)
	require.NoError(t, a.Err())
	stop(t, a)
	stop(t, b)
	requireNothingParked(t, st, a, b)
}

// needProxy skips t unless the outage subtests can run.
func (s suite) needProxy(t *testing.T) {
	t.Helper()
	if !s.h.Features.Proxy {
		t.Skip("Features.Proxy is not set: the harness cannot put a fault proxy between the transport and its broker")
	}
	if s.h.Features.ReconnectRaces && raceEnabled() {
		t.Skip("Features.ReconnectRaces: the broker's client races with itself while it reconnects; run without -race")
	}
}

// checkOrder checks, with Features.Ordered, that the first delivery of each message
// of a key came in the key's commit order; later copies are redeliveries.
func (s suite) checkOrder(t *testing.T, r *reader) {
	t.Helper()
	if !s.h.Features.Ordered {
		return
	}
	first := map[uuid.UUID]bool{}
	next := map[string]int{}
	for _, got := range r.all {
		id := uuid.MustParse(got.ID)
		if first[id] {
			continue
		}
		first[id] = true
		m := r.w.lookup(id)
		if m.key == nil {
			continue
		}
		require.Equal(t, next[string(m.key)], m.seq, "first deliveries of key %q out of commit order", m.key)
		next[string(m.key)]++
	}
}
