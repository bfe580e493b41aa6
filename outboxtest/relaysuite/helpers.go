package relaysuite

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/netfault"
)

// sentMessage is a message the suite wrote, with its place among its key's messages.
type sentMessage struct {
	msg outbox.Message
	key []byte
	seq int
}

// writer writes messages to one topic through the store, in units of work, one
// after the other, so each key's commit order is the order written. Every message
// has an ID the writer chose (some UUIDv4, some UUIDv7) and headers of its own,
// among them duplicated names and empty values; one in seven has no key.
type writer struct {
	st     outboxtest.Store
	sender outbox.Sender
	topic  string
	keys   int

	mu     sync.Mutex
	sent   map[uuid.UUID]*sentMessage
	perKey map[string]int
	next   int
}

func newWriter(t *testing.T, st outboxtest.Store, topic string, keys int) *writer {
	t.Helper()
	sender, err := outbox.NewSender(st, outbox.SenderConfig{})
	require.NoError(t, err)
	return &writer{st: st, sender: sender, topic: topic, keys: keys, sent: map[uuid.UUID]*sentMessage{}, perKey: map[string]int{}}
}

// write writes n more messages, five to a unit of work.
func (w *writer) write(t *testing.T, n int) {
	t.Helper()
	const unit = 5
	for done := 0; done < n; done += unit {
		msgs := make([]*sentMessage, 0, unit)
		w.mu.Lock()
		for range min(unit, n-done) {
			msgs = append(msgs, w.nextMessage())
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		err := w.st.Transact(ctx, func(ctx context.Context) error {
			for _, m := range msgs {
				if err := w.sender.Send(ctx, m.msg); err != nil {
					return err
				}
			}
			return nil
		})
		cancel()
		require.NoError(t, err, "write a unit of work")
		w.mu.Lock()
		for _, m := range msgs {
			w.sent[m.msg.ID] = m
		}
		w.mu.Unlock()
	}
}

// nextMessage makes the next message. Called with w.mu held.
func (w *writer) nextMessage() *sentMessage {
	i := w.next
	w.next++
	id := uuid.New()
	if i%2 == 1 {
		id = uuid.Must(uuid.NewV7())
	}
	m := &sentMessage{msg: outbox.Message{ID: id, Topic: w.topic, Headers: []outbox.Header{{Key: "x-relay-index", Value: fmt.Append(nil, i)}}}}
	if i%5 == 0 {
		m.msg.Headers = append(m.msg.Headers,
			outbox.Header{Key: "x-relay-empty", Value: []byte{}},
			outbox.Header{Key: "x-relay-index", Value: []byte("again")})
	}
	if i%7 == 6 {
		m.msg.Payload = fmt.Appendf(nil, "keyless/%d", i)
		return m
	}
	key := fmt.Sprintf("key-%d", i%w.keys)
	m.key = []byte(key)
	m.seq = w.perKey[key]
	w.perKey[key]++
	m.msg.Key = m.key
	m.msg.Payload = fmt.Appendf(nil, "%s/%d", key, m.seq)
	return m
}

// len is how many messages were written.
func (w *writer) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.sent)
}

func (w *writer) lookup(id uuid.UUID) *sentMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent[id]
}

// ids returns the IDs written so far.
func (w *writer) ids() []uuid.UUID {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]uuid.UUID, 0, len(w.sent))
	for id := range w.sent {
		out = append(out, id)
	}
	return out
}

// reader reads a writer's topic back from the broker and checks every delivery
// against what was written.
type reader struct {
	h      Harness
	w      *writer
	counts map[uuid.UUID]int
	// all is every delivery read, in arrival order.
	all []outboxtest.Received
}

func newReader(h Harness, w *writer) *reader {
	return &reader{h: h, w: w, counts: map[uuid.UUID]int{}}
}

// awaitAll reads until every message written so far has arrived at least once, and
// each one in want at least want[id] times. It fails on a message the writer did not
// write and on one that did not arrive unchanged.
func (r *reader) awaitAll(t *testing.T, want map[uuid.UUID]int) {
	t.Helper()
	for {
		missing := 0
		for _, id := range r.w.ids() {
			missing += max(0, max(1, want[id])-r.counts[id])
		}
		if missing == 0 {
			return
		}
		got := r.h.Read(t, r.w.topic, missing)
		require.Equal(t, missing, len(got), "Harness.Read returns the number of messages asked for")
		for _, d := range got {
			id, err := uuid.Parse(d.ID)
			require.NoError(t, err, "the delivery's ID %q", d.ID)
			m := r.w.lookup(id)
			require.NotNil(t, m, "message %s arrived, but the suite did not write it", id)
			requireReceived(t, m.msg, d, r.h.Features.IdempotencyKey)
			r.counts[id]++
			r.all = append(r.all, d)
		}
	}
}

// requireReceived checks that d is want (its ID set), unchanged: topic, key,
// payload, the message-ID header and the application's headers in order. The
// transport may add an idempotency key equal to the ID when want has none; with
// stampsKey it must.
func requireReceived(t *testing.T, want outbox.Message, d outboxtest.Received, stampsKey bool) {
	t.Helper()
	id := want.ID.String()
	require.Equal(t, id, d.ID, "the delivery's ID")
	require.Equal(t, want.Topic, d.Topic, "topic of %s", id)
	require.True(t, bytes.Equal(want.Key, d.Key), "key of %s: want %q, got %q", id, want.Key, d.Key)
	require.True(t, bytes.Equal(want.Payload, d.Payload), "payload of %s: %d bytes, got %d", id, len(want.Payload), len(d.Payload))
	_, appKey := want.Header(outbox.HeaderIdempotencyKey)
	var app []outbox.Header
	stamped, keys := 0, 0
	for _, h := range d.Headers {
		switch {
		case h.Key == outbox.HeaderMessageID:
			require.Equal(t, id, string(h.Value), "the %s header of %s", outbox.HeaderMessageID, id)
			stamped++
		case h.Key == outbox.HeaderIdempotencyKey && !appKey && string(h.Value) == id:
			keys++
		default:
			app = append(app, h)
		}
	}
	require.Equal(t, 1, stamped, "message %s carries one %s header", id, outbox.HeaderMessageID)
	if stampsKey && !appKey {
		require.Equal(t, 1, keys, "message %s carries one %s header equal to its ID (Features.IdempotencyKey)", id, outbox.HeaderIdempotencyKey)
	}
	require.LessOrEqual(t, keys, 1, "message %s carries one %s header at most", id, outbox.HeaderIdempotencyKey)
	require.Len(t, app, len(want.Headers), "headers of %s: got %v", id, app)
	for i, h := range want.Headers {
		require.Equal(t, h.Key, app[i].Key, "header %d of %s", i, id)
		require.True(t, bytes.Equal(h.Value, app[i].Value), "header %d (%s) of %s: want %q, got %q", i, h.Key, id, h.Value, app[i].Value)
	}
}

// proxies puts a fault proxy in front of every broker address a transport dials, and
// plays the same fault on all of them.
type proxies struct {
	mu       sync.Mutex
	byTarget map[string]*netfault.Proxy
	down     bool
	closed   bool
	err      error
}

func newProxies(t *testing.T) *proxies {
	p := &proxies{byTarget: map[string]*netfault.Proxy{}}
	t.Cleanup(p.close)
	return p
}

// nowhere is an address nothing listens on.
const nowhere = "127.0.0.1:0"

// dial is what the harness's New gets: the proxy's address for target, made on first
// use. A proxy made during a cut starts cut.
func (p *proxies) dial(target string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if px, ok := p.byTarget[target]; ok {
		return px.Addr()
	}
	if p.closed {
		return nowhere
	}
	px, err := netfault.Start(target)
	if err != nil {
		p.err = errors.Join(p.err, err)
		return nowhere
	}
	if p.down {
		px.Cut()
	}
	p.byTarget[target] = px
	return px.Addr()
}

// require fails t unless the transport dialled through a proxy, without error.
func (p *proxies) require(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.NoError(t, p.err)
	require.NotEmpty(t, p.byTarget, "the transport never dialled through the proxy: Harness.New must connect through dial")
}

func (p *proxies) each(f func(px *netfault.Proxy)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, px := range p.byTarget {
		f(px)
	}
}

// cut breaks every connection and refuses new ones until restore.
func (p *proxies) cut() {
	p.mu.Lock()
	p.down = true
	p.mu.Unlock()
	p.each((*netfault.Proxy).Cut)
}

func (p *proxies) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
	p.each((*netfault.Proxy).Restore)
}

// blackhole holes every connection open now, for good; new ones pass.
func (p *proxies) blackhole() { p.each((*netfault.Proxy).Blackhole) }

func (p *proxies) close() {
	p.mu.Lock()
	p.closed = true
	all := make([]*netfault.Proxy, 0, len(p.byTarget))
	for _, px := range p.byTarget {
		all = append(all, px)
	}
	p.mu.Unlock()
	for _, px := range all {
		px.Close()
	}
}

var (
	// errRefused fails a whole call before anything is sent.
	errRefused = errors.New("relaysuite: injected: publish refused before sending")
	// errLostAck reports a message the broker took as failed: its acknowledgement
	// was lost on the way back.
	errLostAck = errors.New("relaysuite: injected: acknowledgement lost")
	// errKeyRefused fails the messages of one key of a call, before they are sent.
	errKeyRefused = errors.New("relaysuite: injected: the key's messages were refused before sending")
)

// faulty wraps the real transport and fails its calls in turn: of every four calls,
// the first fails before anything is sent, the second passes, the third is sent and
// then reported failed (its acknowledgements lost), the fourth fails one key's
// messages before sending and sends the rest. Failures are transient, and fail a
// key's whole tail in the call, so with keeps set the wrapper keeps the promise of a
// [driver.KeyOrderKeeper]. It counts what the broker acknowledged.
type faulty struct {
	next  driver.Transport
	keeps bool

	mu       sync.Mutex
	calls    int
	refusals int
	ack      map[uuid.UUID]int
	lost     map[uuid.UUID]bool
}

// KeepsKeyOrder implements [driver.KeyOrderKeeper].
func (f *faulty) KeepsKeyOrder() bool { return f.keeps }

// Publish implements [driver.Transport].
func (f *faulty) Publish(ctx context.Context, batch []*driver.Envelope) error {
	f.mu.Lock()
	f.calls++
	call := f.calls
	f.mu.Unlock()
	switch call % 4 {
	case 1:
		f.mu.Lock()
		f.refusals++
		f.mu.Unlock()
		return fmt.Errorf("%w (call %d)", errRefused, call)
	case 3:
		err := f.send(ctx, batch)
		failed := failures(err)
		if failed == nil {
			return err // the whole call failed: nothing was taken
		}
		pe := &driver.PublishError{}
		f.mu.Lock()
		for _, env := range batch {
			cause, ok := failed[env.ID]
			if !ok {
				f.lost[env.ID] = true
				cause = errLostAck
			}
			pe.Failed = append(pe.Failed, driver.MessageError{ID: env.ID, Err: cause})
		}
		f.mu.Unlock()
		return pe
	case 0:
		var held []*driver.Envelope
		var key []byte
		pass := make([]*driver.Envelope, 0, len(batch))
		for _, env := range batch {
			if env.Key != nil && key == nil {
				key = env.Key
			}
			if key != nil && env.Key != nil && bytes.Equal(env.Key, key) {
				held = append(held, env)
				continue
			}
			pass = append(pass, env)
		}
		if held == nil {
			return f.send(ctx, batch)
		}
		var err error
		if len(pass) > 0 {
			err = f.send(ctx, pass)
		}
		failed := failures(err)
		if failed == nil && err != nil {
			return err
		}
		pe := &driver.PublishError{}
		for _, env := range held {
			pe.Failed = append(pe.Failed, driver.MessageError{ID: env.ID, Err: errKeyRefused})
		}
		for _, env := range pass {
			if cause, ok := failed[env.ID]; ok {
				pe.Failed = append(pe.Failed, driver.MessageError{ID: env.ID, Err: cause})
			}
		}
		return pe
	default:
		return f.send(ctx, batch)
	}
}

// send publishes batch through the real transport and counts what it acknowledged.
func (f *faulty) send(ctx context.Context, batch []*driver.Envelope) error {
	err := f.next.Publish(ctx, batch)
	failed := failures(err)
	if err != nil && failed == nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, env := range batch {
		if _, ok := failed[env.ID]; !ok {
			f.ack[env.ID]++
		}
	}
	return err
}

// failures indexes a PublishError's failures by ID: empty (not nil) for a nil err,
// nil for an error that fails the whole call.
func failures(err error) map[uuid.UUID]error {
	if err == nil {
		return map[uuid.UUID]error{}
	}
	var pe *driver.PublishError
	if !errors.As(err, &pe) {
		return nil
	}
	out := make(map[uuid.UUID]error, len(pe.Failed))
	for _, m := range pe.Failed {
		out[m.ID] = m.Err
	}
	return out
}

func newFaulty(next driver.Transport, keeps bool) *faulty {
	return &faulty{next: next, keeps: keeps, ack: map[uuid.UUID]int{}, lost: map[uuid.UUID]bool{}}
}

// lostAcks returns the messages whose acknowledgement was lost at least once.
func (f *faulty) lostAcks() map[uuid.UUID]bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[uuid.UUID]bool, len(f.lost))
	for id := range f.lost {
		out[id] = true
	}
	return out
}

// acked is how many times the broker acknowledged message id.
func (f *faulty) acked(id uuid.UUID) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ack[id]
}

// refused is how many calls failed before anything was sent.
func (f *faulty) refused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refusals
}

// raceEnabled reports whether the binary was built with the race detector.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}
