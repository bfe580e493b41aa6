package outboxtest

import (
	"context"
	"errors"
	"fmt"
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
)

// InboxHarness adapts one store to [RunInboxTests].
type InboxHarness struct {
	// New returns a fresh, empty store with one bucket, isolated from every other
	// store New returned, that implements [inbox.Store]. The suite closes it; New
	// registers any other cleanup with t.Cleanup.
	New func(t *testing.T) Store
	// Effect, if set, writes one application effect for key in the unit of work on
	// ctx, through the store's own accessor (a row in a table, an item, an OnCommit
	// apply). With Effects, it lets the suite check the application's writes, not
	// only the messages sent.
	Effect func(ctx context.Context, st Store, key string) error
	// Effects returns how many effects for key committed on st.
	Effects func(t *testing.T, st Store, key string) int
	// Sequential runs the subtests one at a time. By default they run in parallel.
	Sequential bool
}

// RunInboxTests runs the inbox conformance suite against a store: a message's
// effects (the messages its function sends through the outbox, and the harness's
// Effect if set) commit once per consumer, a duplicate skips the function, a failed
// function records nothing, racing units on one key apply it once, and expired keys
// are removed in batches when the store implements [inbox.Remover].
func RunInboxTests(t *testing.T, h InboxHarness) {
	t.Helper()
	require.NotNil(t, h.New, "InboxHarness.New is required")
	require.Equal(t, h.Effect == nil, h.Effects == nil, "InboxHarness.Effect and Effects go together")
	s := inboxSuite{h: h}
	tests := []storeTest{
		{"OnceThenDuplicate", s.onceThenDuplicate},
		{"FailureRecordsNothing", s.failureRecordsNothing},
		{"PanicRecordsNothing", s.panicRecordsNothing},
		{"ConsumersAreIndependent", s.consumersIndependent},
		{"KeySources", s.keySources},
		{"RacingUnitsApplyOnce", s.racing},
		{"ManyKeysConcurrently", s.manyKeys},
		{"JoinsOuterUnit", s.joinsOuter},
		{"RemoveExpiredInBatches", s.removeExpired},
		{"CancelledAndClosed", s.cancelledAndClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !h.Sequential {
				t.Parallel()
			}
			tc.run(t)
		})
	}
}

type inboxSuite struct{ h InboxHarness }

func (s inboxSuite) store(t *testing.T) Store {
	t.Helper()
	st := s.h.New(t)
	require.NotNil(t, st, "InboxHarness.New returned nil")
	require.Equal(t, 1, st.Driver().BucketCount(), "InboxHarness.New must return a store with one bucket")
	_, ok := st.Driver().(inbox.Store)
	require.True(t, ok, "the store %T does not implement inbox.Store on its Driver", st)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func newInbox(t *testing.T, st Store, cfg inbox.Config) *inbox.Inbox {
	t.Helper()
	if cfg.Consumer == "" {
		cfg.Consumer = "conformance"
	}
	in, err := inbox.New(st, cfg)
	require.NoError(t, err)
	return in
}

// delivery is a message as a consumer receives it from a transport.
func delivery(key string) *outbox.Message {
	return &outbox.Message{
		Topic:   "inbox",
		Key:     []byte("k"),
		Payload: []byte(key),
		Headers: []outbox.Header{
			{Key: outbox.HeaderMessageID, Value: []byte(uuid.NewString())},
			{Key: outbox.HeaderIdempotencyKey, Value: []byte(key)},
		},
	}
}

// handler is a consumer function that applies one effect for its key: a message
// sent through the outbox, and the harness's Effect if any.
type handler struct {
	s    inboxSuite
	st   Store
	send outbox.Sender
	runs atomic.Int64
}

func (s inboxSuite) handler(t *testing.T, st Store) *handler {
	return &handler{s: s, st: st, send: sender(t, st, outbox.Transactional)}
}

func (h *handler) fn(key string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		h.runs.Add(1)
		if h.s.h.Effect != nil {
			if err := h.s.h.Effect(ctx, h.st, key); err != nil {
				return err
			}
		}
		return h.send.Send(ctx, outbox.Message{Topic: "effects", Key: []byte(key), Payload: []byte(key)})
	}
}

// applied counts the effects committed for key: the messages sent and, when the
// harness has one, the application's effects, which must agree.
func (h *handler) applied(t *testing.T, key string) int {
	t.Helper()
	n := 0
	for _, p := range payloads(fetch(t, h.st.Driver(), 0)) {
		if p == key {
			n++
		}
	}
	if h.s.h.Effects != nil {
		require.Equal(t, n, h.s.h.Effects(t, h.st, key), "the application's effects for %q must commit with the messages", key)
	}
	return n
}

func (s inboxSuite) onceThenDuplicate(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	in := newInbox(t, st, inbox.Config{})
	h := s.handler(t, st)
	msg := delivery("order-1")

	res, err := in.Process(ctx, msg, h.fn("order-1"))
	require.NoError(t, err)
	assert.Equal(t, inbox.Result{Key: "order-1"}, res)
	require.Equal(t, 1, h.applied(t, "order-1"))

	for range 3 {
		res, err = in.Process(ctx, msg, h.fn("order-1"))
		require.NoError(t, err, "a duplicate is no error")
		assert.Equal(t, inbox.Result{Key: "order-1", Duplicate: true}, res)
	}
	assert.EqualValues(t, 1, h.runs.Load(), "a key recorded already skips the function")
	require.Equal(t, 1, h.applied(t, "order-1"), "a duplicate applies nothing")
}

func (s inboxSuite) failureRecordsNothing(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	in := newInbox(t, st, inbox.Config{})
	h := s.handler(t, st)
	boom := errors.New("boom")
	apply := h.fn("order-2")

	_, err := in.Process(ctx, delivery("order-2"), func(ctx context.Context) error {
		if err := apply(ctx); err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom, "the function's error is returned")
	require.Zero(t, h.applied(t, "order-2"), "a failed function's writes roll back")

	res, err := in.Process(ctx, delivery("order-2"), apply)
	require.NoError(t, err)
	assert.False(t, res.Duplicate, "a failed function records no key: the redelivery runs it again")
	require.Equal(t, 1, h.applied(t, "order-2"))
}

func (s inboxSuite) panicRecordsNothing(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	in := newInbox(t, st, inbox.Config{})
	h := s.handler(t, st)
	apply := h.fn("order-3")

	require.PanicsWithValue(t, "boom", func() {
		_, _ = in.Process(ctx, delivery("order-3"), func(ctx context.Context) error {
			if err := apply(ctx); err != nil {
				return err
			}
			panic("boom")
		})
	})
	require.Zero(t, h.applied(t, "order-3"))
	res, err := in.Process(ctx, delivery("order-3"), apply)
	require.NoError(t, err)
	assert.False(t, res.Duplicate)
	require.Equal(t, 1, h.applied(t, "order-3"))
}

func (s inboxSuite) consumersIndependent(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	billing := newInbox(t, st, inbox.Config{Consumer: "billing"})
	shipping := newInbox(t, st, inbox.Config{Consumer: "shipping"})
	h := s.handler(t, st)
	msg := delivery("order-4")

	for _, in := range []*inbox.Inbox{billing, shipping} {
		res, err := in.Process(ctx, msg, h.fn("order-4"))
		require.NoError(t, err)
		assert.False(t, res.Duplicate, "consumer %s has not seen the key", in.Consumer())
	}
	for _, in := range []*inbox.Inbox{billing, shipping} {
		res, err := in.Process(ctx, msg, h.fn("order-4"))
		require.NoError(t, err)
		assert.True(t, res.Duplicate, "consumer %s has seen the key", in.Consumer())
	}
	require.Equal(t, 2, h.applied(t, "order-4"), "once per consumer")
}

func (s inboxSuite) keySources(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	in := newInbox(t, st, inbox.Config{KeyFunc: func(m *outbox.Message) (string, error) {
		if len(m.Key) == 0 {
			return "", errors.New("no business key")
		}
		return "biz-" + string(m.Key), nil
	}})
	id := uuid.NewString()
	long := strings.Repeat("x", inbox.MaxKeyLength+1)
	cases := []struct {
		name string
		msg  outbox.Message
		want string
	}{
		{"IdempotencyKeyFirst", outbox.Message{Headers: []outbox.Header{
			{Key: outbox.HeaderIdempotencyKey, Value: []byte("first")},
			{Key: outbox.HeaderMessageID, Value: []byte(id)},
			{Key: outbox.HeaderIdempotencyKey, Value: []byte("idem")},
		}}, "idem"},
		{"ThenMessageID", outbox.Message{Key: []byte("7"), Headers: []outbox.Header{{Key: outbox.HeaderMessageID, Value: []byte(id)}}}, id},
		{"ThenKeyFunc", outbox.Message{Key: []byte("7")}, "biz-7"},
		{"LongKeyHashed", outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(long)}}}, ""},
		{"InvalidUTF8Hashed", outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte{0xff, 0xfe}}}}, ""},
	}
	h := s.handler(t, st)
	for _, c := range cases {
		key, err := in.Key(&c.msg)
		require.NoError(t, err, c.name)
		if c.want == "" {
			require.True(t, strings.HasPrefix(key, "sha256:") && len(key) == len("sha256:")+64, "%s: got %q", c.name, key)
		} else {
			require.Equal(t, c.want, key, c.name)
		}
		for i := range 2 {
			res, err := in.Process(ctx, &c.msg, h.fn(key))
			require.NoError(t, err, c.name)
			require.Equal(t, key, res.Key, c.name)
			require.Equal(t, i == 1, res.Duplicate, "%s: delivery %d", c.name, i+1)
		}
		require.Equal(t, 1, h.applied(t, key), c.name)
	}

	_, err := in.Process(ctx, &outbox.Message{Topic: "inbox"}, h.fn("none"))
	require.ErrorContains(t, err, "no business key", "KeyFunc's error is returned")
	bare := newInbox(t, st, inbox.Config{Consumer: "bare"})
	_, err = bare.Process(ctx, &outbox.Message{Topic: "inbox"}, h.fn("none"))
	require.ErrorIs(t, err, outbox.ErrInvalidMessage, "a message with no key and no KeyFunc is refused")
	require.ErrorContains(t, err, "KeyFunc", "the error names the fix")
}

// processUntilDone retries a delivery the way a consumer loop does: a failed unit
// (a conflict between racing transactions, say) is delivered again.
func processUntilDone(ctx context.Context, in *inbox.Inbox, msg *outbox.Message, fn func(context.Context) error) (inbox.Result, []error) {
	var errs []error
	for attempt := range 100 {
		res, err := in.Process(ctx, msg, fn)
		if err == nil {
			return res, errs
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
	return inbox.Result{}, errs
}

func (s inboxSuite) racing(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	h := s.handler(t, st)
	const racers = 6
	for round := range 3 {
		key := fmt.Sprintf("race-%d", round)
		var (
			wg      sync.WaitGroup
			applied atomic.Int64
			dups    atomic.Int64
			failed  sync.Map
		)
		start := make(chan struct{})
		// Racers that get into the function wait there for each other (for a while:
		// on a store that serialises on the key, the others wait before it), so that
		// on a store that checks at commit they commit at the same moment.
		var entered atomic.Int64
		all := make(chan struct{})
		fn := func(ctx context.Context) error {
			if entered.Add(1) == racers {
				close(all)
			}
			select {
			case <-all:
			case <-time.After(300 * time.Millisecond):
			}
			return h.fn(key)(ctx)
		}
		for r := range racers {
			// Each racer is a consumer process of its own: its own inbox value on the
			// same store and consumer name.
			in := newInbox(t, st, inbox.Config{})
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				res, errs := processUntilDone(ctx, in, delivery(key), fn)
				if len(errs) == 100 || ctx.Err() != nil {
					failed.Store(r, errs)
					return
				}
				if res.Duplicate {
					dups.Add(1)
				} else {
					applied.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		failed.Range(func(k, v any) bool {
			t.Errorf("racer %v never finished: %v", k, v)
			return true
		})
		require.EqualValues(t, 1, applied.Load(), "exactly one racer applies the message")
		require.EqualValues(t, racers-1, dups.Load(), "every other racer sees a duplicate")
		require.Equal(t, 1, h.applied(t, key), "the effect committed once")
	}
}

func (s inboxSuite) manyKeys(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	h := s.handler(t, st)
	const keys, workers = 12, 3
	var wg sync.WaitGroup
	errs := make(chan error, keys*workers)
	for w := range workers {
		in := newInbox(t, st, inbox.Config{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every worker delivers every key, each in its own order.
			for i := range keys {
				key := fmt.Sprintf("many-%d", (i+w*5)%keys)
				if _, e := processUntilDone(ctx, in, delivery(key), h.fn(key)); len(e) == 100 {
					errs <- e[len(e)-1]
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a delivery never finished: %v", err)
	}
	for i := range keys {
		key := fmt.Sprintf("many-%d", i)
		require.Equal(t, 1, h.applied(t, key), key)
	}
}

func (s inboxSuite) joinsOuter(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	in := newInbox(t, st, inbox.Config{})
	h := s.handler(t, st)
	boom := errors.New("outer fails")

	err := st.Transact(ctx, func(ctx context.Context) error {
		res, err := in.Process(ctx, delivery("joined"), h.fn("joined"))
		require.NoError(t, err)
		require.False(t, res.Duplicate)
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, h.applied(t, "joined"), "the key and the effects roll back with the outer unit")

	err = st.Transact(ctx, func(ctx context.Context) error {
		_, err := in.Process(ctx, delivery("joined"), h.fn("joined"))
		return err
	})
	require.NoError(t, err)
	require.Equal(t, 1, h.applied(t, "joined"))
	res, err := in.Process(ctx, delivery("joined"), h.fn("joined"))
	require.NoError(t, err)
	require.True(t, res.Duplicate, "the key committed with the outer unit")
}

func (s inboxSuite) removeExpired(t *testing.T) {
	ctx := testContext(t)
	st := s.store(t)
	if _, ok := st.Driver().(inbox.Remover); !ok {
		in := newInbox(t, st, inbox.Config{})
		n, err := in.RemoveExpired(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		t.Skipf("%T removes inbox keys by itself (no inbox.Remover); RemoveExpired does nothing", st)
	}
	var now atomic.Pointer[time.Time]
	start := time.Now().UTC()
	now.Store(&start)
	clock := func() time.Time { return *now.Load() }
	short := newInbox(t, st, inbox.Config{Consumer: "short", Retention: time.Hour, RemoveBatch: 2, Now: clock})
	long := newInbox(t, st, inbox.Config{Consumer: "long", Retention: 48 * time.Hour, RemoveBatch: 2, Now: clock})
	h := s.handler(t, st)
	for i := range 5 {
		_, err := short.Process(ctx, delivery(fmt.Sprint("old-", i)), h.fn(fmt.Sprint("old-", i)))
		require.NoError(t, err)
	}
	_, err := long.Process(ctx, delivery("kept"), h.fn("kept"))
	require.NoError(t, err)

	n, err := short.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing has expired yet")

	later := start.Add(2 * time.Hour)
	now.Store(&later)
	n, err = short.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, 5, n, "every expired key is removed, in batches of RemoveBatch")

	res, err := short.Process(ctx, delivery("old-0"), h.fn("old-0"))
	require.NoError(t, err)
	require.False(t, res.Duplicate, "a removed key is processed again")
	res, err = long.Process(ctx, delivery("kept"), h.fn("kept"))
	require.NoError(t, err)
	require.True(t, res.Duplicate, "a key within its retention is kept")

	// One batch at a time: a store's removal honours the limit.
	r := st.Driver().(inbox.Remover)
	much := start.Add(100 * time.Hour)
	n, err = r.RemoveInboxKeys(ctx, much, 1)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = r.RemoveInboxKeys(ctx, much, 10)
	require.NoError(t, err)
	require.Equal(t, 1, n, "two keys were left: old-0 processed again and kept")
}

func (s inboxSuite) cancelledAndClosed(t *testing.T) {
	st := s.store(t)
	in := newInbox(t, st, inbox.Config{})
	h := s.handler(t, st)
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	_, err := in.Process(ctx, delivery("c"), h.fn("c"))
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, h.runs.Load(), "a cancelled ctx runs nothing")

	require.NoError(t, st.Close())
	_, err = in.Process(testContext(t), delivery("c"), h.fn("c"))
	require.ErrorIs(t, err, outbox.ErrClosed)
}
