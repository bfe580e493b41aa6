package tests

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/dispatcher"
	"github.com/outboxkit/outbox/outboxtest"
	sqlstore "github.com/outboxkit/outbox/store/sql"
)

// tcpProxy forwards connections to PostgreSQL and plays the network between: it
// delays every chunk by a latency, and can black-hole the connections open at that
// moment for good — they stay open and forward nothing, as a path whose packets
// are dropped without a reset — while new connections pass.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	latency time.Duration
	holed   map[*proxied]bool
	open    map[*proxied]bool
}

type proxied struct{ client, server net.Conn }

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tcpProxy{ln: ln, target: target, holed: map[*proxied]bool{}, open: map[*proxied]bool{}}
	go p.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for c := range p.open {
			_ = c.client.Close()
			_ = c.server.Close()
		}
	})
	return p
}

func (p *tcpProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		c := &proxied{client, server}
		p.mu.Lock()
		p.open[c] = true
		p.mu.Unlock()
		go p.pipe(c, client, server)
		go p.pipe(c, server, client)
	}
}

// pipe copies src to dst chunk by chunk, after the latency, unless c is holed.
func (p *tcpProxy) pipe(c *proxied, src, dst net.Conn) {
	defer func() {
		p.mu.Lock()
		holed := p.holed[c]
		delete(p.open, c)
		p.mu.Unlock()
		if !holed { // a holed connection's far side never hears of the close
			_ = dst.Close()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			latency, holed := p.latency, p.holed[c]
			p.mu.Unlock()
			if !holed {
				time.Sleep(latency)
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
			return
		}
	}
}

// blackhole holes every connection open now, for good.
func (p *tcpProxy) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.open {
		p.holed[c] = true
	}
}

func (p *tcpProxy) setLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// proxiedPool is a pgx pool that reaches PostgreSQL through p.
func proxiedPool(t *testing.T) (*pgxpool.Pool, *tcpProxy) {
	postgresPool(t) // skips (or fails under CI) without a server
	u, err := url.Parse(postgresURL())
	require.NoError(t, err)
	p := newTCPProxy(t, u.Host)
	u.Host = p.ln.Addr().String()
	cfg, err := pgxpool.ParseConfig(u.String())
	require.NoError(t, err)
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool, p
}

// A relay whose PostgreSQL connections are black-holed (held open, nothing
// forwarded, no reset) is not wedged: every store call hits its deadline, the pool
// opens new connections, and the relay publishes what was committed meanwhile.
// Without deadlines the calls would wait on the holed connections for good.
func TestBlackHoledConnectionsHitTheirDeadline(t *testing.T) {
	t.Parallel()
	pool, p := proxiedPool(t)
	direct := pgxBackend().open(t, sqlstore.Config{BucketCount: 2})
	viaProxy, err := sqlstore.NewPgx(pool, sqlstore.Config{BucketCount: 2, Table: direct.Config().Table, Logger: quietLog})
	require.NoError(t, err)
	t.Cleanup(func() { _ = viaProxy.Close() })
	rec := outboxtest.NewRecorder()
	d, err := dispatcher.New(viaProxy, rec, dispatcher.Config{RelayID: "a", PollInterval: 50 * time.Millisecond,
		LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second, Logger: quietLog})
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(d.Kill)

	require.NoError(t, direct.Enqueue(testContext(t), newEnvelope(t, direct, "k", "before")))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, rec.WaitForUnique(ctx, 1))

	p.blackhole()
	for i := range 20 {
		require.NoError(t, direct.Enqueue(testContext(t), newEnvelope(t, direct, fmt.Sprintf("k%d", i%3), fmt.Sprintf("during-%d", i))))
	}
	require.NoError(t, rec.WaitForUnique(ctx, 21), "the relay recovers on new connections")
	require.NoError(t, d.Err())
}

// A graceful stop refuses no write with every statement delayed on the network: the
// case where releases one write at a time let peers plan conflicting claims (six
// buckets, three relays).
func TestGracefulStopUnderLatencyRefusesNothing(t *testing.T) {
	t.Parallel()
	pool, p := proxiedPool(t)
	direct := pgxBackend().open(t, sqlstore.Config{BucketCount: 6})
	p.setLatency(3 * time.Millisecond)
	relays := map[string]*dispatcher.Dispatcher{}
	for _, id := range []string{"a", "b", "c"} {
		s, err := sqlstore.NewPgx(pool, sqlstore.Config{BucketCount: 6, Table: direct.Config().Table, Logger: quietLog})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		d, err := dispatcher.New(s, outboxtest.NewRecorder(), dispatcher.Config{RelayID: id, PollInterval: 200 * time.Millisecond,
			LeaseDuration: 5 * time.Minute, LeaseRenewInterval: 100 * time.Second, Logger: quietLog})
		require.NoError(t, err)
		require.NoError(t, d.Start(context.Background()))
		t.Cleanup(d.Kill)
		relays[id] = d
	}
	owned := func(want ...int) func() bool {
		return func() bool {
			for i, id := range []string{"a", "b", "c"}[:len(want)] {
				if len(relays[id].Owned()) != want[i] {
					return false
				}
			}
			return true
		}
	}
	refused := func() (n int64) {
		for _, d := range relays {
			n += d.Stats().RefusedWrites
		}
		return n
	}
	waitUntil(t, "the fleet splits 2/2/2", owned(2, 2, 2))
	before := refused()
	require.NoError(t, relays["c"].Stop(context.Background()))
	waitUntil(t, "a and b hold 3 each", owned(3, 3))
	require.Equal(t, before, refused(), "a graceful stop refuses nothing")
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		require.True(t, time.Now().Before(deadline), what)
		time.Sleep(10 * time.Millisecond)
	}
}
