package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// patience bounds each wait for the consumer to get somewhere; a correct consumer
// gets there in milliseconds, so it only turns a hang into a failure.
const patience = time.Minute

// step is what one Receive of a testSource returns.
type step struct {
	lanes [][]*inbox.Delivery
	err   error
}

// testSource is a broker double: Receive hands out the steps pushed to it (and waits
// for ctx otherwise), and it records what the consumer acknowledges and rejects.
type testSource struct {
	steps     chan step
	rejectErr error                                           // what Reject returns
	onAck     func(ctx context.Context, ds []*inbox.Delivery) // checks at acknowledgement

	mu       sync.Mutex
	acked    []*inbox.Delivery
	acks     int // Ack calls with deliveries
	rejected []*inbox.Delivery
	causes   []error
}

func newSource() *testSource { return &testSource{steps: make(chan step, 100)} }

func (s *testSource) push(lanes ...[]*inbox.Delivery) { s.steps <- step{lanes: lanes} }

func (s *testSource) Receive(ctx context.Context) ([][]*inbox.Delivery, error) {
	select {
	case <-ctx.Done():
		return nil, nil
	case st := <-s.steps:
		return st.lanes, st.err
	}
}

func (s *testSource) Ack(ctx context.Context, ds []*inbox.Delivery) error {
	if s.onAck != nil {
		s.onAck(ctx, ds)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(ds) > 0 {
		s.acks++
	}
	s.acked = append(s.acked, ds...)
	return nil
}

func (s *testSource) Reject(_ context.Context, d *inbox.Delivery, cause error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejected = append(s.rejected, d)
	s.causes = append(s.causes, cause)
	return s.rejectErr
}

// payloads returns the payloads of what was acknowledged, in order.
func (s *testSource) payloads() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, len(s.acked))
	for i, d := range s.acked {
		out[i] = string(d.Payload)
	}
	return out
}

func (s *testSource) ackCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.acked)
}

// extendingSource is a testSource that is told before each retry in place.
type extendingSource struct {
	*testSource
	extendErr error
	extended  atomic.Int64
}

func (s *extendingSource) Extend(context.Context, *inbox.Delivery) error {
	s.extended.Add(1)
	return s.extendErr
}

// stoppingSource is a testSource that holds something for the length of a Run.
type stoppingSource struct {
	*testSource
	stops atomic.Int64
	// acksAtStop is how many deliveries were acknowledged when Stop was called.
	acksAtStop atomic.Int64
}

func (s *stoppingSource) Stop() {
	s.stops.Add(1)
	s.acksAtStop.Store(int64(s.ackCount()))
}

// msg returns a delivery keyed key.
func msg(key, payload string) *inbox.Delivery {
	return &inbox.Delivery{ID: uuid.New(), Message: outbox.Message{
		Topic: "payments", Payload: []byte(payload),
		Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(key)}},
	}}
}

// ledger is the application's state on the memory store, changed only at commit.
type ledger struct {
	mu      sync.Mutex
	applied map[string]int
}

func (l *ledger) apply(ctx context.Context, d *inbox.Delivery) error {
	p := string(d.Payload)
	return memstore.OnCommit(ctx, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.applied[p]++
		return nil
	})
}

func (l *ledger) count(payload string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied[payload]
}

func newInbox(t *testing.T) *inbox.Inbox {
	t.Helper()
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	in, err := inbox.New(store, inbox.Config{Consumer: "billing"})
	require.NoError(t, err)
	return in
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for !cond() {
		require.True(t, time.Now().Before(deadline), "waiting for %s", what)
		time.Sleep(time.Millisecond)
	}
}

// logRecorder keeps the records logged through it.
type logRecorder struct {
	mu      *sync.Mutex
	records *[]slog.Record
	attrs   []slog.Attr
}

func newLogRecorder() logRecorder {
	return logRecorder{mu: &sync.Mutex{}, records: &[]slog.Record{}}
}

func (r logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r logRecorder) Handle(_ context.Context, rec slog.Record) error {
	rec = rec.Clone()
	rec.AddAttrs(r.attrs...)
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.records = append(*r.records, rec)
	return nil
}

func (r logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	r.attrs = append(append([]slog.Attr(nil), r.attrs...), attrs...)
	return r
}

func (r logRecorder) WithGroup(string) slog.Handler { return r }

// pauses returns the "pause" attribute of the records whose message contains what.
func (r logRecorder) pauses(what string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for _, rec := range *r.records {
		if !strings.Contains(rec.Message, what) {
			continue
		}
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "pause" {
				out = append(out, a.Value.Duration())
			}
			return true
		})
	}
	return out
}

func (r logRecorder) messages(level slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range *r.records {
		if rec.Level == level {
			out = append(out, rec.Message)
		}
	}
	return out
}

// Every delivery is acknowledged once, in order, and only after its unit of work
// committed: a handler that fails is rolled back and retried in place, not
// acknowledged, and the Processed hook runs between the commit and the
// acknowledgement.
func TestConsumerAcksOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	l := &ledger{applied: map[string]int{}}
	var mu sync.Mutex
	hooked := map[string]bool{}
	var violations []string
	src := newSource()
	src.onAck = func(ctx context.Context, ds []*inbox.Delivery) {
		mu.Lock()
		defer mu.Unlock()
		for _, d := range ds {
			p := string(d.Payload)
			if l.count(p) != 1 {
				violations = append(violations, p+" acknowledged before its unit committed")
			}
			if !hooked[p] {
				violations = append(violations, p+" acknowledged before the Processed hook")
			}
		}
	}
	var attempts sync.Map
	handle := func(ctx context.Context, d *inbox.Delivery) error {
		n, _ := attempts.LoadOrStore(string(d.Payload), new(atomic.Int64))
		attempt := n.(*atomic.Int64).Add(1)
		if err := l.apply(ctx, d); err != nil {
			return err
		}
		if string(d.Payload) == "1" && attempt == 1 {
			return errors.New("the handler fails once") // rolls the effect back
		}
		return nil
	}
	c, err := inbox.NewConsumer(src, in, handle, inbox.ConsumerConfig{
		RetryBackoff: time.Millisecond,
		Logger:       slog.New(slog.DiscardHandler),
		Processed: func(d *inbox.Delivery, res inbox.Result) {
			mu.Lock()
			defer mu.Unlock()
			hooked[string(d.Payload)] = true
			if res.Duplicate {
				violations = append(violations, string(d.Payload)+" found a duplicate")
			}
		},
	})
	require.NoError(t, err)
	var lane []*inbox.Delivery
	for i := range 5 {
		lane = append(lane, msg(fmt.Sprint("key-", i), fmt.Sprint(i)))
	}
	src.push(lane)
	stop := outboxtest.RunConsumer(t, c)
	waitFor(t, "five acknowledgements", func() bool { return src.ackCount() == 5 })
	require.NoError(t, stop())

	assert.Equal(t, []string{"0", "1", "2", "3", "4"}, src.payloads(), "each acknowledged once, in order")
	for i := range 5 {
		assert.Equal(t, 1, l.count(fmt.Sprint(i)), "message %d applied once", i)
	}
	mu.Lock()
	assert.Empty(t, violations)
	mu.Unlock()
	n, _ := attempts.Load("1")
	assert.EqualValues(t, 2, n.(*atomic.Int64).Load(), "the failed message was retried once in place")
}

// A delivery whose key is recorded already is a duplicate: its handler does not run,
// the Processed hook sees Duplicate, and it is acknowledged like a success.
func TestConsumerAcksDuplicate(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	l := &ledger{applied: map[string]int{}}
	src := newSource()
	var ran atomic.Int64
	var dups []bool
	var mu sync.Mutex
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		ran.Add(1)
		return l.apply(ctx, d)
	}, inbox.ConsumerConfig{Logger: slog.New(slog.DiscardHandler), Processed: func(_ *inbox.Delivery, res inbox.Result) {
		mu.Lock()
		defer mu.Unlock()
		dups = append(dups, res.Duplicate)
	}})
	require.NoError(t, err)
	first, again := msg("payment-1", "40"), msg("payment-1", "40")
	again.Redelivered = true
	src.push([]*inbox.Delivery{first})
	src.push([]*inbox.Delivery{again})
	stop := outboxtest.RunConsumer(t, c)
	waitFor(t, "both acknowledged", func() bool { return src.ackCount() == 2 })
	require.NoError(t, stop())

	assert.EqualValues(t, 1, ran.Load(), "the duplicate's handler did not run")
	assert.Equal(t, 1, l.count("40"))
	mu.Lock()
	assert.Equal(t, []bool{false, true}, dups)
	mu.Unlock()
	src.mu.Lock()
	assert.Equal(t, []*inbox.Delivery{first, again}, src.acked, "the duplicate is acknowledged too")
	src.mu.Unlock()
}

// A failing delivery is retried in place after RetryBackoff, doubled up to
// MaxRetryBackoff, with its Attempt counting up; a failing receive is retried after
// the same pauses.
func TestConsumerRetriesWithConfiguredBackoff(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	src := newSource()
	logs := newLogRecorder()
	const initial, ceiling = 5 * time.Millisecond, 20 * time.Millisecond
	var mu sync.Mutex
	var seen []int
	var at []time.Time
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, d.Attempt)
		at = append(at, time.Now())
		if d.Attempt <= 4 {
			return errors.New("not yet")
		}
		return nil
	}, inbox.ConsumerConfig{RetryBackoff: initial, MaxRetryBackoff: ceiling, Logger: slog.New(logs)})
	require.NoError(t, err)
	for range 3 {
		src.steps <- step{err: errors.New("broker unreachable")}
	}
	src.push([]*inbox.Delivery{msg("k", "v")})
	stop := outboxtest.RunConsumer(t, c)
	waitFor(t, "the acknowledgement", func() bool { return src.ackCount() == 1 })
	require.NoError(t, stop())

	want := []time.Duration{initial, 2 * initial, ceiling, ceiling}
	assert.Equal(t, want, logs.pauses("retrying it in place"), "the pauses double up to MaxRetryBackoff")
	assert.Equal(t, want[:3], logs.pauses("receive failed"), "failed receives back off alike")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []int{1, 2, 3, 4, 5}, seen)
	for i := 1; i < len(at); i++ {
		assert.GreaterOrEqual(t, at[i].Sub(at[i-1]), want[i-1], "attempt %d waited its pause", i+1)
	}
}

// A delivery that cannot be decoded, and one without an inbox key, are rejected with
// an error wrapping ErrInvalidMessage and never reach the handler; the lane goes on.
// A source that cannot settle such a message (Reject fails) stops its lane there.
func TestConsumerRejectsUndecodable(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	src := newSource()
	logs := newLogRecorder()
	var handled []string
	var mu sync.Mutex
	handle := func(_ context.Context, d *inbox.Delivery) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, string(d.Payload))
		return nil
	}
	c, err := inbox.NewConsumer(src, in, handle, inbox.ConsumerConfig{Logger: slog.New(logs)})
	require.NoError(t, err)
	garbled := inbox.Undecodable("raw bytes", errors.New("no message id header"))
	keyless := &inbox.Delivery{Message: outbox.Message{Topic: "payments", Payload: []byte("keyless")}}
	good := msg("k", "good")
	src.push([]*inbox.Delivery{garbled, keyless, good})
	stop := outboxtest.RunConsumer(t, c)
	waitFor(t, "the good delivery", func() bool { return src.ackCount() == 1 })
	require.NoError(t, stop())

	src.mu.Lock()
	assert.Equal(t, []*inbox.Delivery{garbled, keyless}, src.rejected)
	for _, cause := range src.causes {
		assert.ErrorIs(t, cause, outbox.ErrInvalidMessage)
	}
	assert.ErrorContains(t, src.causes[0], "no message id header")
	assert.Equal(t, []*inbox.Delivery{good}, src.acked, "rejected deliveries are not acknowledged")
	src.mu.Unlock()
	assert.Equal(t, "raw bytes", garbled.Raw)
	mu.Lock()
	assert.Equal(t, []string{"good"}, handled)
	mu.Unlock()
	assert.Len(t, logs.messages(slog.LevelError), 2, "each rejection is logged at ERROR")

	// Reject fails: the message stays with the broker and its lane stops; the other
	// lane and the next receive go on.
	in = newInbox(t)
	src = newSource()
	src.rejectErr = errors.New("left on the queue")
	c, err = inbox.NewConsumer(src, in, handle, inbox.ConsumerConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	held := msg("k2", "held back")
	src.push([]*inbox.Delivery{inbox.Undecodable(nil, errors.New("garbled")), held}, []*inbox.Delivery{msg("k3", "other lane")})
	src.push([]*inbox.Delivery{msg("k4", "next receive")})
	stop = outboxtest.RunConsumer(t, c)
	waitFor(t, "the other lane and the next receive", func() bool { return src.ackCount() == 2 })
	require.NoError(t, stop())
	assert.Equal(t, []string{"other lane", "next receive"}, src.payloads())
	mu.Lock()
	assert.NotContains(t, handled, "held back", "the rest of the lane is not processed")
	mu.Unlock()
}

// Once Run's ctx is done, the delivery in progress finishes, with a live ctx, and is
// acknowledged before Run returns; no further delivery starts.
func TestConsumerStopsGracefully(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	src := newSource()
	entered, release := make(chan struct{}), make(chan struct{})
	var ctxErr atomic.Value
	var ran atomic.Int64
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		if ran.Add(1) == 1 {
			close(entered)
			<-release
			ctxErr.Store(fmt.Sprint(ctx.Err()))
		}
		return nil
	}, inbox.ConsumerConfig{StopTimeout: patience, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var ackCtxErr atomic.Value
	src.onAck = func(ctx context.Context, ds []*inbox.Delivery) {
		if len(ds) > 0 {
			ackCtxErr.Store(fmt.Sprint(ctx.Err()))
		}
	}
	src.push([]*inbox.Delivery{msg("a", "first"), msg("b", "second")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-entered
	cancel() // stop while the first delivery is in its handler
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a delivery was in progress", err)
	default:
	}
	close(release)
	require.NoError(t, <-done)
	assert.Equal(t, "<nil>", ctxErr.Load(), "the delivery in progress kept a live ctx")
	assert.Equal(t, "<nil>", ackCtxErr.Load(), "and was acknowledged with one")
	assert.Equal(t, []string{"first"}, src.payloads(), "acknowledged before Run returned; the second never started")
	assert.EqualValues(t, 1, ran.Load())
}

// A delivery that outlasts StopTimeout has its ctx cancelled: Run returns nil and the
// delivery is not acknowledged.
func TestConsumerStopTimeout(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	src := newSource()
	const timeout = 20 * time.Millisecond
	entered := make(chan struct{})
	var waited atomic.Int64
	var cancelledAt atomic.Value
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		close(entered)
		<-ctx.Done()
		waited.Store(int64(time.Since(cancelledAt.Load().(time.Time))))
		return ctx.Err()
	}, inbox.ConsumerConfig{StopTimeout: timeout, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src.push([]*inbox.Delivery{msg("a", "stuck")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-entered
	cancelledAt.Store(time.Now())
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(patience):
		t.Fatal("Run did not return after StopTimeout")
	}
	assert.GreaterOrEqual(t, time.Duration(waited.Load()), timeout, "the delivery's ctx lasted StopTimeout past Run's")
	assert.Zero(t, src.ackCount(), "a delivery cut off is not acknowledged")
}

// Lanes run concurrently, each in order: a lane whose first delivery fails holds back
// only its own lane. The acknowledgement comes once per receive, lane after lane, and
// a Stopper's Stop comes once, after it. After Run returns no goroutine of the
// consumer is left. (Not parallel: it reads every goroutine's stack.)
func TestConsumerLanesAndNoGoroutineLeft(t *testing.T) {
	in := newInbox(t)
	src := &stoppingSource{testSource: newSource()}
	other := make(chan struct{})
	var mu sync.Mutex
	var order []string
	var failed atomic.Bool
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		p := string(d.Payload)
		switch {
		case p == "a1" && !failed.Load():
			// Wait for the other lane: only concurrent lanes get past this.
			select {
			case <-other:
			case <-time.After(patience):
				return errors.New("the other lane did not run meanwhile")
			}
			failed.Store(true)
			return errors.New("a1 fails once")
		case p == "b1":
			defer close(other)
		}
		mu.Lock()
		defer mu.Unlock()
		order = append(order, p)
		return nil
	}, inbox.ConsumerConfig{RetryBackoff: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src.push(
		[]*inbox.Delivery{msg("a1", "a1"), msg("a2", "a2")},
		[]*inbox.Delivery{msg("b1", "b1"), msg("b2", "b2")},
	)
	stop := outboxtest.RunConsumer(t, c)
	waitFor(t, "four acknowledgements", func() bool { return src.ackCount() == 4 })
	require.NoError(t, stop())

	mu.Lock()
	assert.Less(t, indexOf(order, "b1"), indexOf(order, "a1"), "lane b went on while lane a retried")
	assert.Less(t, indexOf(order, "a1"), indexOf(order, "a2"))
	assert.Less(t, indexOf(order, "b1"), indexOf(order, "b2"))
	mu.Unlock()
	assert.Equal(t, []string{"a1", "a2", "b1", "b2"}, src.payloads(), "one acknowledgement, lane after lane")
	src.mu.Lock()
	assert.Equal(t, 1, src.acks, "one acknowledgement for the receive")
	src.mu.Unlock()
	assert.EqualValues(t, 1, src.stops.Load())
	assert.EqualValues(t, 4, src.acksAtStop.Load(), "Stop comes after the last acknowledgement")

	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for _, fn := range []string{"inbox.(*Consumer)", "inbox_test.(*testSource)"} {
		assert.NotContains(t, stacks, fn, "a goroutine of the consumer outlived Run")
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// An Extender is told before each retry in place; one that cannot keep the message
// makes the consumer leave it to the broker and stop its lane, unacknowledged.
func TestConsumerExtendsBeforeRetry(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	src := &extendingSource{testSource: newSource()}
	var calls atomic.Int64
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		if string(d.Payload) == "flaky" && d.Attempt <= 2 {
			calls.Add(1)
			return errors.New("not yet")
		}
		return nil
	}, inbox.ConsumerConfig{RetryBackoff: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src.push([]*inbox.Delivery{msg("k", "flaky")})
	stop := outboxtest.RunConsumer(t, c)
	waitFor(t, "the acknowledgement", func() bool { return src.ackCount() == 1 })
	require.NoError(t, stop())
	assert.EqualValues(t, 2, src.extended.Load(), "extended before each of the two retries")

	in = newInbox(t)
	src = &extendingSource{testSource: newSource(), extendErr: errors.New("cannot hold it")}
	var attempts atomic.Int64
	c, err = inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		if string(d.Payload) == "fails" {
			attempts.Add(1)
			return errors.New("fails")
		}
		return nil
	}, inbox.ConsumerConfig{RetryBackoff: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	src.push([]*inbox.Delivery{msg("k1", "fails"), msg("k2", "behind it")}, []*inbox.Delivery{msg("k3", "other")})
	stop = outboxtest.RunConsumer(t, c)
	waitFor(t, "the other lane", func() bool { return src.ackCount() == 1 })
	require.NoError(t, stop())
	assert.Equal(t, []string{"other"}, src.payloads(), "the failed delivery and the rest of its lane stay with the broker")
	assert.EqualValues(t, 1, attempts.Load(), "not retried in place")
}

// A receive that reports a misconfiguration or a closed client ends Run with its
// error; Run refuses to run twice at once.
func TestConsumerRunEndsOnFatalReceive(t *testing.T) {
	t.Parallel()
	for _, sentinel := range []error{outbox.ErrMisconfigured, outbox.ErrClosed} {
		src := newSource()
		src.steps <- step{err: fmt.Errorf("%w: the source's complaint", sentinel)}
		c, err := inbox.NewConsumer(src, newInbox(t), func(context.Context, *inbox.Delivery) error { return nil }, inbox.ConsumerConfig{})
		require.NoError(t, err)
		err = c.Run(context.Background())
		require.ErrorIs(t, err, sentinel)
		require.ErrorContains(t, err, "the source's complaint")
	}

	src := newSource()
	c, err := inbox.NewConsumer(src, newInbox(t), func(context.Context, *inbox.Delivery) error { return nil }, inbox.ConsumerConfig{})
	require.NoError(t, err)
	src.push([]*inbox.Delivery{msg("k", "v")})
	stop := outboxtest.RunConsumer(t, c)
	waitFor(t, "the first Run", func() bool { return src.ackCount() == 1 })
	require.ErrorIs(t, c.Run(context.Background()), outbox.ErrMisconfigured, "a second Run at once is refused")
	require.NoError(t, stop())
}

func TestConsumerConfigValidate(t *testing.T) {
	t.Parallel()
	for field, cfg := range map[string]inbox.ConsumerConfig{
		"ConsumerConfig.RetryBackoff":    {RetryBackoff: -1},
		"ConsumerConfig.MaxRetryBackoff": {MaxRetryBackoff: -1},
		"ConsumerConfig.StopTimeout":     {StopTimeout: -time.Second},
	} {
		err := cfg.Validate()
		require.ErrorIs(t, err, outbox.ErrMisconfigured, field)
		require.ErrorContains(t, err, field)
		_, err = inbox.NewConsumer(newSource(), newInbox(t), func(context.Context, *inbox.Delivery) error { return nil }, cfg)
		require.ErrorIs(t, err, outbox.ErrMisconfigured, field)
		require.ErrorContains(t, err, field)
	}
	require.NoError(t, inbox.ConsumerConfig{}.Validate())

	h := func(context.Context, *inbox.Delivery) error { return nil }
	_, err := inbox.NewConsumer(nil, newInbox(t), h, inbox.ConsumerConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Source")
	_, err = inbox.NewConsumer(newSource(), nil, h, inbox.ConsumerConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Inbox")
	_, err = inbox.NewConsumer(newSource(), newInbox(t), nil, inbox.ConsumerConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "Handler")
}

// Handle, the step for one pushed delivery, applies it once, reports a duplicate as a
// nil error, passes the handler's error on, and refuses what can never be processed
// with ErrInvalidMessage.
func TestInboxHandle(t *testing.T) {
	t.Parallel()
	in := newInbox(t)
	l := &ledger{applied: map[string]int{}}
	ctx := context.Background()
	d := msg("payment-1", "40")
	res, err := in.Handle(ctx, d, l.apply)
	require.NoError(t, err)
	assert.False(t, res.Duplicate)
	res, err = in.Handle(ctx, msg("payment-1", "40"), l.apply)
	require.NoError(t, err)
	assert.True(t, res.Duplicate)
	assert.Equal(t, 1, l.count("40"))

	failure := errors.New("handler failure")
	_, err = in.Handle(ctx, msg("payment-2", "41"), func(context.Context, *inbox.Delivery) error { return failure })
	require.ErrorIs(t, err, failure)
	require.NotErrorIs(t, err, outbox.ErrInvalidMessage)

	_, err = in.Handle(ctx, inbox.Undecodable(nil, errors.New("garbled")), l.apply)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorContains(t, err, "garbled")
	_, err = in.Handle(ctx, &inbox.Delivery{Message: outbox.Message{Topic: "t"}}, l.apply)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = in.Handle(ctx, nil, l.apply)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = in.Handle(ctx, d, nil)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	// A key function's own failure is never processable either.
	store, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	defer store.Close()
	keyed, err := inbox.New(store, inbox.Config{Consumer: "c", KeyFunc: func(*outbox.Message) (string, error) {
		return "", errors.New("no key in this payload")
	}})
	require.NoError(t, err)
	_, err = keyed.Handle(ctx, &inbox.Delivery{Message: outbox.Message{Topic: "t"}}, l.apply)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorContains(t, err, "no key in this payload")
}
