package relaysuite_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
)

// recorders is the test binary's broker: a Recorder per topic, read back in order.
type recorders struct {
	mu       sync.Mutex
	byTopic  map[string]*outboxtest.Recorder
	offsets  map[string]int
	readWait time.Duration
}

func newRecorders(readWait time.Duration) *recorders {
	return &recorders{byTopic: map[string]*outboxtest.Recorder{}, offsets: map[string]int{}, readWait: readWait}
}

func (rs *recorders) of(topic string) *outboxtest.Recorder {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.byTopic[topic]
	if r == nil {
		r = outboxtest.NewRecorder()
		rs.byTopic[topic] = r
	}
	return r
}

// read returns the next n messages recorded on topic.
func (rs *recorders) read(tb testing.TB, topic string, n int) []outboxtest.Received {
	tb.Helper()
	r := rs.of(topic)
	deadline := time.Now().Add(rs.readWait)
	for {
		rs.mu.Lock()
		off := rs.offsets[topic]
		got := r.Received(topic)
		if len(got) >= off+n {
			rs.offsets[topic] = off + n
			rs.mu.Unlock()
			return got[off : off+n]
		}
		rs.mu.Unlock()
		require.True(tb, time.Now().Before(deadline), "%d messages on %s, want %d more", len(got)-off, topic, n)
		time.Sleep(5 * time.Millisecond)
	}
}

// keepsOrder declares what a Recorder does: it records a call's messages in order,
// all or none, so it never acknowledges a key's message after failing an earlier one.
type keepsOrder struct{ driver.Transport }

func (keepsOrder) KeepsKeyOrder() bool { return true }

// wire reaches a topic's Recorder over TCP, as a client reaches its broker, so the
// suite's fault proxy has a connection to break: each call sends a request and waits
// at most a second for the answer; a call that fails drops its connection, and the
// next dials again. It pings by dialling.
type wire struct {
	srv  *server
	addr func() string

	mu   sync.Mutex
	conn net.Conn
	rd   *bufio.Reader
}

// Publish implements [driver.Transport].
func (w *wire) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn == nil {
		c, err := net.DialTimeout("tcp", w.addr(), time.Second)
		if err != nil {
			return fmt.Errorf("wire: %w", err)
		}
		w.conn, w.rd = c, bufio.NewReader(c)
	}
	seq := w.srv.stage(batch)
	_ = w.conn.SetDeadline(time.Now().Add(time.Second))
	_, err := fmt.Fprintf(w.conn, "publish %d\n", seq)
	var line string
	if err == nil {
		line, err = w.rd.ReadString('\n')
	}
	if err == nil && line != "ok\n" {
		err = fmt.Errorf("answer %q", line)
	}
	if err != nil {
		_ = w.conn.Close()
		w.conn = nil
		return fmt.Errorf("wire: %w", err)
	}
	return nil
}

// Ping implements [driver.Pinger].
func (w *wire) Ping(ctx context.Context) error {
	d := net.Dialer{Timeout: time.Second}
	c, err := d.DialContext(ctx, "tcp", w.addr())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "ok\n" {
		err = fmt.Errorf("answer %q", line)
	}
	return err
}

// server records the batches staged with it into a Recorder when a request names
// them.
type server struct {
	rec *outboxtest.Recorder
	ln  net.Listener

	mu     sync.Mutex
	seq    int
	staged map[int][]*driver.Envelope
}

func newServer(tb testing.TB, rec *outboxtest.Recorder) *server {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	s := &server{rec: rec, ln: ln, staged: map[int][]*driver.Envelope{}}
	var wg sync.WaitGroup
	var conns sync.Map
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			wg.Go(func() {
				defer c.Close()
				s.serve(c)
			})
		}
	})
	tb.Cleanup(func() {
		_ = ln.Close()
		conns.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	return s
}

func (s *server) stage(batch []*driver.Envelope) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.staged[s.seq] = batch
	return s.seq
}

func (s *server) serve(c net.Conn) {
	rd := bufio.NewReader(c)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		var seq int
		if _, err := fmt.Sscanf(line, "publish %d", &seq); err == nil {
			s.mu.Lock()
			batch := s.staged[seq]
			delete(s.staged, seq)
			s.mu.Unlock()
			if err := s.rec.Publish(context.Background(), batch); err != nil {
				_, _ = fmt.Fprintf(c, "failed: %v\n", err)
				continue
			}
		}
		if _, err := fmt.Fprintln(c, "ok"); err != nil {
			return
		}
	}
}

// harness relays to Recorders. Over TCP (when the suite asks for a proxy, or
// overTCP is set) the transport keeps key order and pings; in process it does
// neither.
func harness(rs *recorders, overTCP bool, wrap func(driver.Transport) driver.Transport) relaysuite.Harness {
	var mu sync.Mutex
	servers := map[string]*server{}
	return relaysuite.Harness{
		New: func(tb testing.TB, topic string, dial func(addr string) string) driver.Transport {
			rec := rs.of(topic)
			var tr driver.Transport = rec
			if overTCP {
				mu.Lock()
				srv := servers[topic]
				if srv == nil {
					srv = newServer(tb, rec)
					servers[topic] = srv
				}
				mu.Unlock()
				target := srv.ln.Addr().String()
				addr := func() string { return target }
				if dial != nil {
					addr = func() string { return dial(target) }
				}
				tr = &wire{srv: srv, addr: addr}
			}
			if wrap != nil {
				tr = wrap(tr)
			}
			return tr
		},
		Read: rs.read,
		Raw: func(_ testing.TB, tr driver.Transport) func(context.Context, []*driver.Envelope) error {
			// The in-process transport is the Recorder itself: the baseline is the
			// same call, which measures the benchmark's own overhead.
			return tr.Publish
		},
		// Over TCP every transport is a wire, or wraps one, and pings.
		Features: relaysuite.Features{Ordered: true, Proxy: overTCP, Pinger: overTCP},
	}
}

// pingingKeeper is the transport over TCP as the suite sees it: a key-order keeper
// and a pinger.
type pingingKeeper struct{ *wire }

func (pingingKeeper) KeepsKeyOrder() bool { return true }

// sizeLimit is the limit of the suite's own transport over TCP.
const sizeLimit = 64 << 10

// limitedKeeper is the transport over TCP as a key-order keeper with a size limit:
// it refuses a message over the limit before sending it, permanently, and (unless
// it is broken) fails its key's later messages in the call, as a key-order keeper
// must.
type limitedKeeper struct {
	pingingKeeper
	holdsNothingBack bool
}

func (limitedKeeper) MaxMessageSize() int { return sizeLimit }

func (l limitedKeeper) Publish(ctx context.Context, batch []*driver.Envelope) error {
	var send []*driver.Envelope
	pe := &driver.PublishError{}
	refused := map[string]bool{}
	for _, env := range batch {
		switch {
		case env.Size() > sizeLimit:
			pe.Failed = append(pe.Failed, driver.MessageError{ID: env.ID, Err: driver.Permanent(fmt.Errorf("%w: %d bytes", outbox.ErrTooLarge, env.Size()))})
			if env.Key != nil && !l.holdsNothingBack {
				refused[string(env.Key)] = true
			}
		case env.Key != nil && refused[string(env.Key)]:
			pe.Failed = append(pe.Failed, driver.MessageError{ID: env.ID, Err: errors.New("held back behind a refused message of its key")})
		default:
			send = append(send, env)
		}
	}
	if len(send) > 0 {
		if err := l.pingingKeeper.Publish(ctx, send); err != nil {
			return err
		}
	}
	if len(pe.Failed) == 0 {
		return nil
	}
	return pe
}

// limited is a harness over TCP whose transport is a limitedKeeper.
func limited(readWait time.Duration, holdsNothingBack bool) relaysuite.Harness {
	h := harness(newRecorders(readWait), true, func(tr driver.Transport) driver.Transport {
		return limitedKeeper{pingingKeeper{tr.(*wire)}, holdsNothingBack}
	})
	h.Features.KeepsKeyOrder = true
	h.Features.SizeLimiter = true
	h.Features.HeadersAtLimit = 28
	return h
}

func TestRecorderInProcess(t *testing.T) {
	relaysuite.Run(t, harness(newRecorders(10*time.Second), false, nil))
}

func TestRecorderOverTCP(t *testing.T) {
	relaysuite.Run(t, limited(30*time.Second, false))
}

func BenchmarkRecorder(b *testing.B) {
	h := harness(newRecorders(10*time.Second), false, nil)
	relaysuite.Benchmark(b, h)
}

// broken transports the suite must fail, each with what it must say, and the
// subtest that shows it.
var broken = map[string]struct {
	subtest string
	says    string
	harness func() relaysuite.Harness
}{
	"Lossy": {"RelaysEveryMessage", "messages on", func() relaysuite.Harness {
		n := 0
		var mu sync.Mutex
		return harness(newRecorders(2*time.Second), false, func(tr driver.Transport) driver.Transport {
			return transportFunc(func(ctx context.Context, batch []*driver.Envelope) error {
				mu.Lock()
				n++
				drop := n == 3
				mu.Unlock()
				if drop { // acknowledged, never delivered
					return tr.Publish(ctx, batch[1:])
				}
				return tr.Publish(ctx, batch)
			})
		})
	}},
	"Reversed": {"RelaysEveryMessage", "out of commit order", func() relaysuite.Harness {
		h := harness(newRecorders(10*time.Second), false, func(tr driver.Transport) driver.Transport {
			return keepsOrder{transportFunc(func(ctx context.Context, batch []*driver.Envelope) error {
				reversed := slices.Clone(batch)
				slices.Reverse(reversed)
				return tr.Publish(ctx, reversed)
			})}
		})
		h.Features.KeepsKeyOrder = true
		return h
	}},
	"HeadersLost": {"RelaysEveryMessage", "headers of", func() relaysuite.Harness {
		return harness(newRecorders(10*time.Second), false, func(tr driver.Transport) driver.Transport {
			return transportFunc(func(ctx context.Context, batch []*driver.Envelope) error {
				stripped := make([]*driver.Envelope, len(batch))
				for i, env := range batch {
					stripped[i] = env.Clone()
					stripped[i].Headers = slices.DeleteFunc(stripped[i].Headers, func(h outbox.Header) bool { return h.Key == "x-relay-empty" })
				}
				return tr.Publish(ctx, stripped)
			})
		})
	}},
	"ParksForAnOutage": {"Outage/CutOffParksNothing", "parked", func() relaysuite.Harness {
		// A ping that always answers: the relay takes the outage for failing
		// messages and parks them.
		return harness(newRecorders(5*time.Second), true, func(tr driver.Transport) driver.Transport {
			return liar{tr.(*wire)}
		})
	}},
	"MisdeclaresItsCapabilities": {"Capabilities", "Features.Pinger is false: the transport is a driver.Pinger", func() relaysuite.Harness {
		h := harness(newRecorders(10*time.Second), true, nil)
		h.Features.Pinger = false
		return h
	}},
	"HoldsNothingBack": {"SizeLimit/HoldsBackItsKey", "the refused message and its key's later one", func() relaysuite.Harness {
		return limited(10*time.Second, true)
	}},
	"BypassesTheProxy": {"Outage/Cut", "never dialled through the proxy", func() relaysuite.Harness {
		h := harness(newRecorders(10*time.Second), true, nil)
		next := h.New
		h.New = func(tb testing.TB, topic string, _ func(string) string) driver.Transport { return next(tb, topic, nil) }
		return h
	}},
}

// liar pings successfully whatever the network does.
type liar struct{ *wire }

func (liar) Ping(context.Context) error { return nil }

type transportFunc func(ctx context.Context, batch []*driver.Envelope) error

func (f transportFunc) Publish(ctx context.Context, batch []*driver.Envelope) error {
	return f(ctx, batch)
}

const brokenEnv = "OUTBOX_RELAYSUITE_BROKEN"

// The suite is not blind: run in a child process against a broken transport, the
// subtest that should notice fails, and says why.
func TestSuiteFailsBrokenTransports(t *testing.T) {
	if name := os.Getenv(brokenEnv); name != "" {
		relaysuite.Run(t, broken[name].harness())
		return
	}
	for name, tc := range broken {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteFailsBrokenTransports$/^"+strings.ReplaceAll(tc.subtest, "/", "$/^")+"$", "-test.count=1")
			cmd.Env = append(os.Environ(), brokenEnv+"="+name)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "the suite passed a broken transport (%v):\n%s", err, out)
			require.Contains(t, string(out), tc.says, "the failure says why:\n%s", out)
			require.Contains(t, string(out), "--- FAIL: TestSuiteFailsBrokenTransports/"+tc.subtest, "the failure is in %s:\n%s", tc.subtest, out)
		})
	}
}
