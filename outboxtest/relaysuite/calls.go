package relaysuite

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
)

// The subtests of this file call the transport directly, without a relay: what a
// relay retries before it can be seen.

// transport runs the conformance suite of package outboxtest on the transports New
// makes (with a nil dial), one topic each.
func (s suite) transport(t *testing.T) {
	limit := 0
	if s.h.Features.SizeLimiter {
		if l, ok := s.h.New(t, topicName("limit"), nil).(driver.SizeLimiter); ok {
			limit = l.MaxMessageSize()
		}
	}
	outboxtest.RunTransportTests(t, outboxtest.TransportHarness{
		New: func(t *testing.T, topics ...string) driver.Transport {
			require.Len(t, topics, 1, "a relay suite harness makes a transport per topic")
			return s.h.New(t, topics[0], nil)
		},
		Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
			return s.h.Read(t, topic, n)
		},
		MaxMessageSize: limit,
		// A key-order keeper is handed a key's messages in one call, in order: it
		// must publish them so.
		Ordered:    s.h.Features.Ordered || s.h.Features.KeepsKeyOrder,
		EmptyIsNil: s.h.Features.EmptyIsNil,
	})
}

// publish is one Publish call, bounded by callTimeout.
func publish(tr driver.Transport, batch ...*driver.Envelope) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return tr.Publish(ctx, batch)
}

// ping is one Ping, bounded by timeout.
func ping(p driver.Pinger, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return p.Ping(ctx)
}

func envelope(t *testing.T, m outbox.Message) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(m, Buckets)
	require.NoError(t, err)
	return env
}

// readAll reads topic until every message of want arrived, and requires each to
// arrive unchanged, once, with Features.Ordered the first deliveries of each key in
// want's order. A message of mayRepeat may arrive again unless the broker
// deduplicates (a client may deliver what it reported failed).
func (s suite) readAll(t *testing.T, topic string, want []*driver.Envelope, mayRepeat map[uuid.UUID]bool) {
	t.Helper()
	byID := make(map[string]*driver.Envelope, len(want))
	next := map[string][]string{}
	for _, env := range want {
		byID[env.ID.String()] = env
		if env.Key != nil {
			next[string(env.Key)] = append(next[string(env.Key)], env.ID.String())
		}
	}
	seen := map[string]bool{}
	for len(seen) < len(want) {
		missing := len(want) - len(seen)
		for _, d := range s.h.Read(t, topic, missing) {
			env, ok := byID[d.ID]
			require.True(t, ok, "message %s arrived, but the suite did not publish it", d.ID)
			requireReceived(t, env.Message, d, s.h.Features.IdempotencyKey)
			if seen[d.ID] {
				require.True(t, mayRepeat[env.ID] && !s.h.Features.Deduplicates, "message %s arrived twice", d.ID)
				continue
			}
			seen[d.ID] = true
			if env.Key == nil {
				continue
			}
			if s.h.Features.Ordered {
				require.Equal(t, next[string(env.Key)][0], d.ID, "first deliveries of key %q out of publish order", env.Key)
			}
			next[string(env.Key)] = slices.DeleteFunc(next[string(env.Key)], func(id string) bool { return id == d.ID })
		}
	}
}

// outageCall publishes single calls through a cut: one during it fails without
// claiming anything sent, and Ping then fails; once the proxy heals, Ping answers
// again, the first retry succeeds (or, with Features.ReconnectBackoff, one after the
// client's backoff), and so does the next call. Every message
// arrives; only the failed call's may arrive twice, unless the broker deduplicates
// (a client may still deliver what it buffered during the cut: NATS, Kafka).
func (s suite) outageCall(t *testing.T) {
	s.needProxy(t)
	px := newProxies(t)
	topic := topicName("outage-call")
	tr := s.h.New(t, topic, px.dial)
	var pinger driver.Pinger
	if s.h.Features.Pinger {
		pinger, _ = tr.(driver.Pinger)
	}
	// A relay hands a transport that is no key-order keeper one message of a key per
	// call: a call of ten keys. A keeper gets three keys' messages in one.
	keys := 10
	if s.h.Features.KeepsKeyOrder {
		keys = 3
	}
	seq := 0
	batch := func(n int) []*driver.Envelope {
		out := make([]*driver.Envelope, n)
		for i := range out {
			out[i] = envelope(t, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", seq%keys), Payload: fmt.Appendf(nil, "%d", seq)})
			seq++
		}
		return out
	}
	before := batch(10)
	require.NoError(t, publish(tr, before...))
	px.require(t)
	if pinger != nil {
		require.NoError(t, ping(pinger, callTimeout), "Ping answers before the cut")
	}

	px.cut()
	cut := batch(10)
	err := publish(tr, cut...)
	require.Error(t, err, "nothing reaches a cut broker")
	if pe := failures(err); pe != nil {
		require.Len(t, pe, len(cut), "nothing is acknowledged while cut off: %v", err)
		for id, cause := range pe {
			require.False(t, driver.IsPermanent(cause), "an outage is transient (%s): %v", id, cause)
		}
	} else {
		require.False(t, driver.IsPermanent(err), "an outage is transient: %v", err)
	}
	if pinger != nil {
		require.Error(t, ping(pinger, 10*time.Second), "Ping fails while the broker is cut off")
	}

	px.restore()
	if pinger != nil {
		waitFor(t, "Ping to answer once the proxy healed", func() bool { return ping(pinger, 5*time.Second) == nil })
	}
	if s.h.Features.ReconnectBackoff {
		retries := 0
		waitFor(t, "the retry after the outage to succeed", func() bool {
			retries++
			return publish(tr, cut...) == nil
		})
		t.Logf("the retry succeeded at attempt %d", retries)
	} else {
		require.NoError(t, publish(tr, cut...), "the retry once the proxy healed: the client reconnects")
	}
	after := batch(10)
	require.NoError(t, publish(tr, after...))
	mayRepeat := map[uuid.UUID]bool{}
	for _, env := range cut {
		mayRepeat[env.ID] = true
	}
	s.readAll(t, topic, append(append(before, cut...), after...), mayRepeat)
}

// pingHonoursContext pings with a context that has ended.
func (s suite) pingHonoursContext(t *testing.T) {
	if !s.h.Features.Pinger {
		t.Skip("Features.Pinger is not set")
	}
	p, ok := s.h.New(t, topicName("ping"), nil).(driver.Pinger)
	require.True(t, ok, "Features.Pinger is set: the transport must be a driver.Pinger")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := p.Ping(ctx)
	require.True(t, errors.Is(err, context.Canceled), "a Ping with a cancelled context says so: %v", err)
}

// limit returns tr's MaxMessageSize, skipping t unless Features.SizeLimiter is set
// and the limit is positive.
func (s suite) limit(t *testing.T, tr driver.Transport) (driver.SizeLimiter, int) {
	t.Helper()
	if !s.h.Features.SizeLimiter {
		t.Skip("Features.SizeLimiter is not set")
	}
	l, ok := tr.(driver.SizeLimiter)
	require.True(t, ok, "Features.SizeLimiter is set: the transport must be a driver.SizeLimiter")
	if l.MaxMessageSize() <= 0 {
		t.Skip("the transport has no size limit")
	}
	return l, l.MaxMessageSize()
}

// sized returns m with a payload that brings its Size to exactly size: random
// (incompressible) bytes, or letters when text is set.
func sized(t *testing.T, m outbox.Message, size int, text bool) outbox.Message {
	t.Helper()
	m.Payload = nil
	require.Greater(t, size, m.Size(), "room for a payload")
	if text {
		m.Payload = bytes.Repeat([]byte{'x'}, size-m.Size())
	} else {
		m.Payload = make([]byte, size-m.Size())
		_, _ = rand.Read(m.Payload)
	}
	require.Equal(t, size, m.Size())
	return m
}

// limitShapes are the messages atTheLimit publishes at the limit: a binary payload
// alone, a text one, and a key with Features.HeadersAtLimit headers (plain names of
// growing length, in order).
func (s suite) limitShapes(topic string) []outbox.Message {
	keyed := outbox.Message{Topic: topic, Key: []byte("customer-7")}
	for i := range s.h.Features.HeadersAtLimit {
		name := fmt.Sprintf("h-%02d-%s", i, strings.Repeat(string(rune('a'+i%26)), 1+i))
		keyed.Headers = append(keyed.Headers, outbox.Header{Key: name, Value: fmt.Appendf(nil, "v%d", i)})
	}
	return []outbox.Message{{Topic: topic}, {Topic: topic}, keyed}
}

// atTheLimit publishes messages whose Size is exactly the transport's limit, then
// the same one byte larger beside a small one.
func (s suite) atTheLimit(t *testing.T) {
	topic := topicName("limit")
	tr := s.h.New(t, topic, nil)
	_, limit := s.limit(t, tr)
	var at, over []*driver.Envelope
	for i, shape := range s.limitShapes(topic) {
		at = append(at, envelope(t, sized(t, shape, limit, i == 1)))
		over = append(over, envelope(t, sized(t, shape, limit+1, i == 1)))
	}
	require.NoError(t, publish(tr, at...), "messages of the limit's size")
	s.readUnordered(t, topic, at)

	small := envelope(t, outbox.Message{Topic: topic, Payload: []byte("fine")})
	fails := outboxtest.Failures(t, publish(tr, append(over, small)...))
	require.Len(t, fails, len(over), "only the messages over the limit fail")
	for _, env := range over {
		cause := fails[env.ID]
		require.Error(t, cause, "message %s, one byte over the limit", env.ID)
		require.True(t, driver.IsPermanent(cause), "too large is permanent: %v", cause)
		require.ErrorIs(t, cause, outbox.ErrTooLarge)
	}
	s.readUnordered(t, topic, []*driver.Envelope{small})
}

// readUnordered reads len(want) messages of topic and requires them to be want,
// once each, unchanged, in any order.
func (s suite) readUnordered(t *testing.T, topic string, want []*driver.Envelope) {
	t.Helper()
	byID := make(map[string]*driver.Envelope, len(want))
	for _, env := range want {
		byID[env.ID.String()] = env
	}
	for _, d := range s.h.Read(t, topic, len(want)) {
		env, ok := byID[d.ID]
		require.True(t, ok, "message %s arrived unexpected, or twice", d.ID)
		delete(byID, d.ID)
		requireReceived(t, env.Message, d, s.h.Features.IdempotencyKey)
	}
}

// holdsBackItsKey publishes a key's messages around one over the limit: a key-order
// keeper fails the refused message's later ones of its key, transiently, and sends
// the rest. It may have sent the held-back ones all the same (NATS with PipelineKeys
// and Redis send a key's messages before they learn that an earlier one failed;
// the relay's retry is then a copy), so the suite reads past them.
func (s suite) holdsBackItsKey(t *testing.T) {
	if !s.h.Features.KeepsKeyOrder {
		t.Skip("Features.KeepsKeyOrder is not set: the relay never puts two messages of a key in one call")
	}
	topic := topicName("held")
	tr := s.h.New(t, topic, nil)
	_, limit := s.limit(t, tr)
	first := envelope(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: []byte("first")})
	big := envelope(t, sized(t, outbox.Message{Topic: topic, Key: []byte("k")}, limit+1, false))
	later := envelope(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: []byte("later")})
	keyless := envelope(t, outbox.Message{Topic: topic, Payload: []byte("keyless")})
	other := envelope(t, outbox.Message{Topic: topic, Key: []byte("j"), Payload: []byte("other")})

	fails := outboxtest.Failures(t, publish(tr, first, big, later, keyless, other))
	require.Len(t, fails, 2, "the refused message and its key's later one: %v", fails)
	require.True(t, driver.IsPermanent(fails[big.ID]), "too large is permanent: %v", fails[big.ID])
	require.ErrorIs(t, fails[big.ID], outbox.ErrTooLarge)
	require.Error(t, fails[later.ID], "the later message of the refused one's key is held back")
	require.False(t, driver.IsPermanent(fails[later.ID]), "a held-back message goes once its predecessor is parked: %v", fails[later.ID])
	want := map[string]*driver.Envelope{}
	for _, env := range []*driver.Envelope{first, keyless, other} {
		want[env.ID.String()] = env
	}
	for len(want) > 0 {
		d := s.h.Read(t, topic, 1)[0]
		if d.ID == later.ID.String() {
			continue
		}
		env, ok := want[d.ID]
		require.True(t, ok, "message %s arrived unexpected, or twice", d.ID)
		delete(want, d.ID)
		requireReceived(t, env.Message, d, s.h.Features.IdempotencyKey)
	}
}

// captureRefuses wires the transport into capture (outbox.SenderConfig.Transport):
// capture refuses a message one byte over the transport's limit at Send, inside a
// unit of work and outside one, before writing anything; it takes one at the limit,
// which is relayed and delivered. Without the wiring capture takes the oversized
// message, and the relay parks it on its first attempt.
func (s suite) captureRefuses(t *testing.T) {
	topic := topicName("capture")
	tr := s.h.New(t, topic, nil)
	limiter, limit := s.limit(t, tr)
	st := s.store(t)
	if l, ok := st.(driver.SizeLimiter); ok && l.MaxMessageSize() > 0 && l.MaxMessageSize() <= limit {
		t.Skipf("the store's limit (%d) is not above the transport's (%d)", l.MaxMessageSize(), limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	wired, err := outbox.NewSender(st, outbox.SenderConfig{Transport: limiter})
	require.NoError(t, err)
	immediate, err := outbox.NewSender(st, outbox.SenderConfig{Mode: outbox.Immediate, Transport: limiter})
	require.NoError(t, err)
	send := func(sender outbox.Sender, m outbox.Message) error {
		return st.Transact(ctx, func(ctx context.Context) error { return sender.Send(ctx, m) })
	}

	over := sized(t, outbox.Message{Topic: topic, Key: []byte("k")}, limit+1, false)
	err = send(wired, over)
	require.ErrorIs(t, err, outbox.ErrTooLarge)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorIs(t, immediate.Send(ctx, over), outbox.ErrTooLarge)
	admin, _ := st.Driver().(driver.Admin)
	if admin != nil {
		pending, err := admin.List(ctx, driver.Pending, driver.Cursor{}, 10)
		require.NoError(t, err)
		require.Empty(t, pending, "nothing was written")
	}

	atLimit := sized(t, outbox.Message{Topic: topic, Key: []byte("k")}, limit, false)
	require.NoError(t, send(wired, atLimit))
	d := newRelay(t, st, tr, config("capture"))
	sweep(t, d, func() bool { return d.Stats().Published+d.Stats().Parked >= 1 })
	require.EqualValues(t, 1, d.Stats().Published, "the message at the limit is relayed")
	got := s.h.Read(t, topic, 1)[0]
	require.True(t, bytes.Equal(atLimit.Payload, got.Payload), "the message at the limit arrives intact")

	unwired, err := outbox.NewSender(st, outbox.SenderConfig{})
	require.NoError(t, err)
	require.NoError(t, send(unwired, over), "without the wiring capture takes it (the store's limit is larger)")
	sweep(t, d, func() bool { return d.Stats().Parked >= 1 })
	require.Zero(t, d.Stats().Retried, "a permanent failure is not retried")
	if admin != nil {
		parked, err := admin.List(ctx, driver.Parked, driver.Cursor{}, 10)
		require.NoError(t, err)
		require.Len(t, parked, 1, "the relay parks what capture did not check")
		assert.Contains(t, parked[0].LastError, outbox.ErrTooLarge.Error())
	}
}

// sweep runs d's RunOnce until done, a bounded number of times.
func sweep(t *testing.T, d *relay.Relay, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for round := 0; !done(); round++ {
		require.Less(t, round, 100, "the relay's sweeps did not get there")
		_, err := d.RunOnce(ctx)
		require.NoError(t, err)
		if !done() {
			time.Sleep(20 * time.Millisecond) // the longest backoff
		}
	}
}
