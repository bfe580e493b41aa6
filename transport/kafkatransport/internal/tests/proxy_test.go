package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// netProxy stands between a client and an in-process cluster, one listener per
// broker, and plays the network: it can add latency, black-hole every connection and
// reset them.
//
// A black hole holds connections open and forwards nothing. What a side wrote during
// the hole stays in flight and is delivered, in order, when the hole heals, as TCP
// retransmits it once the path is back; that holds after a normal close too, whose
// FIN follows the data. Only a reset (RST) discards what was in flight: a side that
// resets its connection loses what it had sent and not yet delivered.
type netProxy struct {
	t      testing.TB
	routes map[string]string // broker address → proxy listener address

	mu      sync.Mutex
	changed *sync.Cond // signalled on any change below
	holed   bool
	latency time.Duration
	links   map[*link]struct{}
	// queued counts the bytes held in flight over every link; writing counts writes
	// under way. Both zero: the proxy delivered or dropped everything it was given.
	queued  int
	writing int
	// dropped counts bytes discarded because their sender reset its connection.
	dropped int
	closed  bool
}

// link is one proxied connection: two directions, each a pipe.
type link struct {
	client, server net.Conn
	up, down       *pipe
	// reset is set when either side reset the connection: both directions drop what
	// they hold and both sides are reset.
	reset bool
}

// pipe carries one direction of a link.
type pipe struct {
	src, dst net.Conn
	chunks   []chunk
	eof      bool // src closed normally: forward what is held, then close dst's write side
}

type chunk struct {
	at   time.Time
	data []byte
}

// newProxy starts a proxy in front of every broker of c.
func newProxy(t testing.TB, c *kfake.Cluster) *netProxy {
	t.Helper()
	p := &netProxy{t: t, routes: map[string]string{}, links: map[*link]struct{}{}}
	p.changed = sync.NewCond(&p.mu)
	for _, addr := range c.ListenAddrs() {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		p.routes[addr] = ln.Addr().String()
		go p.accept(ln, addr)
		t.Cleanup(func() { _ = ln.Close() })
	}
	t.Cleanup(p.close)
	return p
}

// dial is a kgo.Dialer that reaches every broker through the proxy.
func (p *netProxy) dial(ctx context.Context, network, host string) (net.Conn, error) {
	to, ok := p.routes[host]
	if !ok {
		return nil, fmt.Errorf("proxy: no route to %s", host)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, to)
}

// clientOpts makes a client reach c's brokers through the proxy.
func (p *netProxy) clientOpts(c *kfake.Cluster) []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.Dialer(p.dial)}
}

func (p *netProxy) accept(ln net.Listener, target string) {
	for {
		client, err := ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", target)
		if err != nil {
			_ = client.Close()
			continue
		}
		l := &link{client: client, server: server}
		l.up = &pipe{src: client, dst: server}
		l.down = &pipe{src: server, dst: client}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.links[l] = struct{}{}
		p.mu.Unlock()
		for _, pp := range []*pipe{l.up, l.down} {
			go p.read(l, pp)
			go p.write(l, pp)
		}
	}
}

// read takes what src sends into the pipe as soon as it arrives, hole or not.
func (p *netProxy) read(l *link, pp *pipe) {
	buf := make([]byte, 64<<10)
	for {
		n, err := pp.src.Read(buf)
		p.mu.Lock()
		if n > 0 && !l.reset {
			pp.chunks = append(pp.chunks, chunk{at: time.Now(), data: append([]byte(nil), buf[:n]...)})
			p.queued += n
		}
		if err != nil {
			if errors.Is(err, syscall.ECONNRESET) {
				p.lockedReset(l)
			} else {
				pp.eof = true
			}
		}
		p.changed.Broadcast()
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// write delivers what the pipe holds to dst once no hole stands in the way and the
// latency has passed.
func (p *netProxy) write(l *link, pp *pipe) {
	for {
		p.mu.Lock()
		for !p.closed && !l.reset && (p.holed || len(pp.chunks) == 0) && !(pp.eof && len(pp.chunks) == 0 && !p.holed) {
			p.changed.Wait()
		}
		switch {
		case p.closed:
			p.mu.Unlock()
			return
		case l.reset:
			p.mu.Unlock()
			resetConn(pp.dst)
			return
		case len(pp.chunks) == 0: // eof, everything delivered
			p.mu.Unlock()
			if tc, ok := pp.dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			} else {
				_ = pp.dst.Close()
			}
			return
		}
		c := pp.chunks[0]
		wait := time.Until(c.at.Add(p.latency))
		if wait > 0 {
			p.mu.Unlock()
			time.Sleep(min(wait, 5*time.Millisecond)) // recheck the hole and resets often
			continue
		}
		pp.chunks = pp.chunks[1:]
		p.writing++
		p.mu.Unlock()

		_, err := pp.dst.Write(c.data)

		p.mu.Lock()
		p.writing--
		p.queued -= len(c.data)
		p.changed.Broadcast()
		p.mu.Unlock()
		if err != nil {
			// The receiving side is gone: reset the sending side too.
			p.mu.Lock()
			p.lockedReset(l)
			p.changed.Broadcast()
			p.mu.Unlock()
			return
		}
	}
}

// lockedReset marks l reset and drops what both directions hold, as a reset does
// to data in flight.
func (p *netProxy) lockedReset(l *link) {
	if l.reset {
		return
	}
	l.reset = true
	for _, pp := range []*pipe{l.up, l.down} {
		for _, c := range pp.chunks {
			p.queued -= len(c.data)
			p.dropped += len(c.data)
		}
		pp.chunks = nil
	}
	delete(p.links, l)
}

// blackhole holds every connection open and forwards nothing until heal.
func (p *netProxy) blackhole() {
	p.mu.Lock()
	p.holed = true
	p.changed.Broadcast()
	p.mu.Unlock()
}

// heal lets what is in flight through, in order, and everything after it.
func (p *netProxy) heal() {
	p.mu.Lock()
	p.holed = false
	p.changed.Broadcast()
	p.mu.Unlock()
}

func (p *netProxy) close() {
	p.mu.Lock()
	p.closed = true
	links := p.links
	p.links = map[*link]struct{}{}
	p.changed.Broadcast()
	p.mu.Unlock()
	for l := range links {
		_ = l.client.Close()
		_ = l.server.Close()
	}
}

// resetConn closes c with a reset (RST): the kernel discards what it had not
// delivered.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
