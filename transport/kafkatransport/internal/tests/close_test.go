package tests

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

const closeBuckets = 4

// closeRelay builds a memory store and a relay that publishes through tr.
func closeRelay(t *testing.T, tr *kafkatransport.Transport) (*memstore.Store, *relay.Relay) {
	t.Helper()
	store, err := memstore.New(memstore.Config{BucketCount: closeBuckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	r, err := relay.New(store, tr, relay.Config{
		RelayID:      "relay-" + t.Name(),
		BucketCount:  closeBuckets,
		PollInterval: 10 * time.Millisecond,
		BackoffBase:  time.Millisecond,
		BackoffMax:   20 * time.Millisecond,
		Jitter:       -1,
		Logger:       slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	return store, r
}

// enqueueKey writes n messages of one key to store.
func enqueueKey(t *testing.T, store *memstore.Store, topic string, n int) {
	t.Helper()
	for i := range n {
		env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: []byte("k"), Payload: fmt.Appendf(nil, "%d", i)}, closeBuckets)
		require.NoError(t, err)
		require.NoError(t, store.Driver().Enqueue(context.Background(), env))
	}
}

// pendingIn counts the store's pending messages.
func pendingIn(t *testing.T, store *memstore.Store) int {
	t.Helper()
	st, err := store.Driver().(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	n := 0
	for _, c := range st.Pending {
		n += c
	}
	return n
}

// leaksSettled waits until Find reports no goroutine beyond opts, trying for as long
// as a busy machine can take to end goroutines that are on their way out, and returns
// its last report.
func leaksSettled(opts ...goleak.Option) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// clientOwned ignores the goroutines of a connection between the caller's client and
// the test's cluster, on either side: the client may open one while the relay runs,
// and it is the client's (and the cluster's) until they are closed.
var clientOwned = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kgo.(*broker).handleReqs"),
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kgo.(*brokerCxn).handleResps"),
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*clientConn).read"),
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*clientConn).read.func1"),
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*clientConn).write"),
}

// clusterHolding ignores the goroutines with which the test's cluster holds a produce
// request until release.
var clusterHolding = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*Cluster).SleepControl"),
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*Cluster).SleepControl.func1"),
	goleak.IgnoreAnyFunction("github.com/twmb/franz-go/pkg/kfake.(*bsleep).wait"),
}

// heldProduce is a relay stopped while the broker holds its produce request: Publish
// returned, and the records on the wire stay with the client until release.
type heldProduce struct {
	cluster *kfake.Cluster
	client  *kgo.Client
	tr      *kafkatransport.Transport
	release func()
	// beforeRelay ignores every goroutine that ran before the relay was built.
	beforeRelay goleak.Option
}

func newHeldProduce(t *testing.T) *heldProduce {
	t.Helper()
	const topic = "close"
	c := newCluster(t, 1, topic)
	// The broker holds produce requests while hold is set, until release.
	var hold atomic.Bool
	arrived := make(chan struct{}, 1)
	released := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(released) }) }
	t.Cleanup(release)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if hold.Load() {
			select {
			case arrived <- struct{}{}:
			default:
			}
			c.SleepControl(func() { <-released })
		}
		return nil, nil, false
	})
	// The client waits for a held request as long as the test may take, so only the
	// broker's answer, or closing the client, resolves it; the transport waits until
	// the relay ends its publish (a negative AckTimeout, which fits any lease).
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ProduceRequestTimeout(10*time.Minute), kgo.RequestTimeoutOverhead(10*time.Minute))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	tr, err := kafkatransport.New(cl, kafkatransport.Config{AckTimeout: -1})
	require.NoError(t, err)
	// Warm up: metadata, the producer id and the connections are the client's.
	require.NoError(t, tr.Ping(t.Context()))
	require.NoError(t, tr.Publish(t.Context(), []*driver.Envelope{envelope(t, outbox.Message{Topic: topic, Payload: []byte("warm")})}))

	beforeRelay := goleak.IgnoreCurrent()
	store, r := closeRelay(t, tr)
	require.NoError(t, r.Start(context.Background()))
	// A first message goes through; the next batch's produce is held by the broker.
	// Each wait is for one publish: a minute is ample on a busy machine.
	enqueueKey(t, store, topic, 1)
	deadline := time.Now().Add(time.Minute)
	for pendingIn(t, store) > 0 {
		require.True(t, time.Now().Before(deadline), "the relay did not publish the first message")
		time.Sleep(5 * time.Millisecond)
	}
	hold.Store(true)
	enqueueKey(t, store, topic, 3)
	select {
	case <-arrived:
	case <-time.After(time.Minute):
		t.Fatal("no produce request reached the broker")
	}

	// Stop with a context that has ended: the batch in flight is cut short and
	// Publish returns, but the records on the wire stay with the client.
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Stop(ended), context.Canceled)
	assert.Equal(t, 3, pendingIn(t, store), "a batch cut short is not assumed sent")

	// Close waits for the produce call the relay left behind.
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	err = tr.Close(short)
	cancelShort()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the broker still holds the produce request")
	assert.ErrorContains(t, err, "1 produce call is still under way")
	require.ErrorIs(t, tr.Publish(t.Context(), []*driver.Envelope{envelope(t, outbox.Message{Topic: topic, Payload: []byte("late")})}), outbox.ErrClosed)
	return &heldProduce{cluster: c, client: cl, tr: tr, release: release, beforeRelay: beforeRelay}
}

// TestNoGoroutineOutlivesStopAndClose: a relay stopped while the broker holds its
// produce request leaves that produce with the client. The transport's Close waits
// for it; afterwards no goroutine of the relay, the store or the transport is left,
// only the caller's client's, and once the caller closed its client nothing is.
//
// Not parallel: goleak looks at every goroutine of the process.
func TestNoGoroutineOutlivesStopAndClose(t *testing.T) {
	t.Run("broker answers late", func(t *testing.T) {
		start := goleak.IgnoreCurrent()
		h := newHeldProduce(t)
		h.release()
		// Bounded so that a Close that never returns fails the test: the broker's
		// answer to one request takes far less.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, h.tr.Close(ctx), "the broker answered: every produce call ended")
		require.NoError(t, h.tr.Close(ctx), "closing again")
		require.NoError(t, leaksSettled(append([]goleak.Option{h.beforeRelay}, clientOwned...)...),
			"goroutines of the relay, the store or the transport left after Stop and Close")

		h.client.Close()
		h.cluster.Close()
		require.NoError(t, leaksSettled(start))
		goleak.VerifyNone(t, start)
	})

	t.Run("broker never answers", func(t *testing.T) {
		start := goleak.IgnoreCurrent()
		h := newHeldProduce(t)
		// The caller gives up on the broker and closes its client, which fails every
		// record it holds: the produce call ends, and Close with it.
		h.client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, h.tr.Close(ctx))
		require.NoError(t, leaksSettled(append(append([]goleak.Option{h.beforeRelay}, clientOwned...), clusterHolding...)...),
			"goroutines of the relay, the store or the transport left after Stop and Close")

		h.release()
		h.cluster.Close()
		require.NoError(t, leaksSettled(start))
		goleak.VerifyNone(t, start)
	})
}
