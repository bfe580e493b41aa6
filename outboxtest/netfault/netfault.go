// Package netfault puts a TCP proxy between a client and a real server, so tests can
// play the network's faults against the real thing: latency on every chunk, a cut
// (every connection broken, new ones refused until Restore), and a black hole (the
// connections open at that moment stay open and forward nothing, for good, as a path
// whose packets are dropped without a reset; new connections pass).
package netfault

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards every connection it accepts to its target.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	down    bool
	latency time.Duration
	links   map[*link]bool
	wg      sync.WaitGroup
}

type link struct {
	client, server net.Conn
	holed          bool
	// pipes counts the directions still running: a holed link stays listed until
	// both end, so that a Cut (or the proxy's close) can still end the other one.
	pipes int
}

// New starts a proxy to target (host:port) on 127.0.0.1; it stops at tb's cleanup.
func New(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := Start(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// Start starts a proxy to target (host:port) on 127.0.0.1 that runs until Close. It
// suits code that makes proxies where no test is at hand, such as a dialer called
// from a client's own goroutines; tests use New.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("netfault: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port: dial it instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: up, pipes: 2}
		p.mu.Lock()
		p.links[l] = true
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(l, c, up)
		go p.pipe(l, up, c)
	}
}

// pipe copies src to dst chunk by chunk, after the latency, unless l is holed.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			latency, holed := p.latency, l.holed
			p.mu.Unlock()
			if !holed {
				time.Sleep(latency)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					err = werr
				}
			}
		}
		if err != nil {
			break
		}
	}
	p.mu.Lock()
	holed := l.holed
	if l.pipes--; l.pipes == 0 {
		delete(p.links, l)
	}
	p.mu.Unlock()
	_ = src.Close()
	if !holed { // a holed connection's far side never hears of the close
		_ = dst.Close()
	}
}

// Cut breaks every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for l := range p.links {
		_ = l.client.Close()
		_ = l.server.Close()
	}
}

// Restore accepts connections again after a Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Blackhole holes every connection open now, for good: they stay open and forward
// nothing. New connections pass.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.holed = true
	}
}

// SetLatency delays every chunk forwarded from now on by d.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// Close stops the proxy: it stops listening, breaks every connection and waits for
// its goroutines to end. Calling it again does nothing more.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}
