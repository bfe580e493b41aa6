package logtests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// fastRelay is a relay config that moves quickly on a test's scale.
func fastRelay(id string) relay.Config {
	return relay.Config{
		RelayID: id, PollInterval: 100 * time.Millisecond,
		LeaseDuration: 3 * time.Second, LeaseRenewInterval: time.Second,
		BackoffBase: 100 * time.Millisecond, BackoffMax: 500 * time.Millisecond,
		StreamRetryBudget: 300 * time.Millisecond, Logger: quietLog,
	}
}

func startRelay(t testing.TB, s *sqlstore.Store, tr driver.Transport, cfg relay.Config) *relay.Relay {
	t.Helper()
	r, err := relay.New(s, tr, cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(testContext(t)))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

// sendKeyed sends n messages per key through units of work of 1 to 3 messages, and
// returns the payloads per key in the order sent.
func sendKeyed(t testing.TB, s *sqlstore.Store, keys []string, n int) map[string][]string {
	t.Helper()
	ctx := testContext(t)
	snd := sender(t, s, outbox.Transactional)
	sent := map[string][]string{}
	var queue []outbox.Message
	for i := range n {
		for _, k := range keys {
			queue = append(queue, message(k, i))
		}
	}
	for len(queue) > 0 {
		size := min(len(queue), 1+rand.IntN(3))
		unit := queue[:size]
		queue = queue[size:]
		require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
			for _, m := range unit {
				if err := snd.Send(ctx, m); err != nil {
					return err
				}
			}
			return nil
		}))
		for _, m := range unit {
			sent[string(m.Key)] = append(sent[string(m.Key)], string(m.Payload))
		}
	}
	return sent
}

// requireKeyOrder checks every message was delivered and each key's first deliveries
// are in the order sent.
func requireKeyOrder(t testing.TB, rec *outboxtest.Recorder, sent map[string][]string) {
	t.Helper()
	byKey := rec.ByKey()
	for k, want := range sent {
		var got []string
		for _, e := range byKey[k] {
			got = append(got, string(e.Payload))
		}
		require.Equal(t, want, got, "key %s: first deliveries in the order sent", k)
	}
}

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%d", i)
	}
	return out
}

// The relay reads the stream and publishes every message in per-key order; the table
// stays empty, and the slot is confirmed past what was published.
func TestRelayStreamsEndToEnd(t *testing.T) {
	eachClient(t, func(t *testing.T, c client) {
		ctx := testContext(t)
		s := open(t, c, sqlstore.Config{})
		rec := outboxtest.NewRecorder()
		r := startRelay(t, s, rec, fastRelay("r1"))
		sent := sendKeyed(t, s, keys(8), 40)
		require.NoError(t, rec.WaitForUnique(ctx, 320))
		requireKeyOrder(t, rec, sent)
		require.Zero(t, countRows(t, s), "nothing went to the table")
		require.NoError(t, r.Stop(ctx))
		require.EqualValues(t, 320, r.Stats().Published)

		st, err := s.Driver().(driver.Admin).Stats(ctx)
		require.NoError(t, err)
		require.NotNil(t, st.Stream)
		require.False(t, st.Stream.Active, "the reader let go of the slot on Stop")
		// What was published is confirmed: a new reader gets nothing again.
		requireQuiet(t, openStream(t, s))
	})
}

// A relay killed at any point (no confirm, no release) and replaced loses nothing;
// first deliveries keep key order.
func TestRelayKilledLosesNothing(t *testing.T) {
	eachClient(t, func(t *testing.T, c client) {
		ctx := testContext(t)
		s := open(t, c, sqlstore.Config{})
		rec := outboxtest.NewRecorder()
		var wg sync.WaitGroup
		var sent map[string][]string
		sending := make(chan struct{})
		wg.Go(func() {
			defer close(sending)
			sent = sendKeyed(t, s, keys(6), 60)
		})
		kills := 0
		for i := 0; ; i++ {
			if kills > 0 && chanClosed(sending) {
				break
			}
			cfg := fastRelay(fmt.Sprintf("r%d", i))
			cfg.LeaseDuration, cfg.LeaseRenewInterval = 1500*time.Millisecond, 500*time.Millisecond
			cfg.StreamRetryBudget = 200 * time.Millisecond
			r, err := relay.New(s, rec, cfg)
			require.NoError(t, err)
			require.NoError(t, r.Start(ctx))
			// Kill once this relay published something, at a random point after.
			before := rec.Len()
			for rec.Len() == before && !chanClosed(sending) {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
			r.Kill()
			kills++
		}
		wg.Wait()
		t.Logf("%d relays killed while sending", kills)
		last := startRelay(t, s, rec, fastRelay("last"))
		require.NoError(t, rec.WaitForUnique(ctx, 360))
		requireKeyOrder(t, rec, sent)
		require.NoError(t, last.Stop(ctx))
		t.Logf("%d deliveries of 360 messages (%d duplicates)", rec.Len(), rec.Duplicates())
	})
}

func chanClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

var errBrokerDown = errors.New("broker refuses this key")

// A key whose publishes keep failing moves to the table lane past the retry budget,
// with every later message of the key while it is held; other keys keep streaming.
// Once the broker takes the key again, the table drains in order and the key streams
// again. A permanent failure is parked in the table, where Admin sees it.
func TestBrokerFailuresDivertToTheTableLane(t *testing.T) {
	eachClient(t, func(t *testing.T, c client) {
		ctx := testContext(t)
		s := open(t, c, sqlstore.Config{})
		rec := outboxtest.NewRecorder()
		var down atomic.Bool
		down.Store(true)
		rec.FailWhen(func(env *driver.Envelope) error {
			switch {
			case string(env.Key) == "poison":
				return driver.Permanent(errors.New("poison"))
			case string(env.Key) == "key-0" && down.Load():
				return errBrokerDown
			}
			return nil
		})
		r := startRelay(t, s, rec, fastRelay("r1"))
		sent := sendKeyed(t, s, keys(3), 10)
		// key-1 and key-2 stream through while key-0 is refused.
		require.Eventually(t, func() bool { return len(rec.ByKey()["key-1"]) == 10 && len(rec.ByKey()["key-2"]) == 10 },
			time.Minute, 20*time.Millisecond)
		require.Eventually(t, func() bool { return countRows(t, s) == 10 }, time.Minute, 20*time.Millisecond,
			"key-0's messages went to the table")
		require.Empty(t, rec.ByKey()["key-0"])
		require.EqualValues(t, 10, r.Stats().Diverted)

		// A poison message is parked at once, in the table.
		require.NoError(t, sender(t, s, outbox.Immediate).Send(ctx, outbox.Message{Topic: "orders", Key: []byte("poison"), Payload: []byte("p")}))
		require.Eventually(t, func() bool {
			parked, err := s.Driver().(driver.Admin).List(ctx, driver.Parked, driver.Cursor{}, 10)
			return err == nil && len(parked) == 1 && string(parked[0].Key) == "poison"
		}, time.Minute, 20*time.Millisecond)

		// The broker takes key-0 again: the table drains in order, then the key
		// streams again (nothing more goes to the table).
		down.Store(false)
		require.NoError(t, rec.WaitForUnique(ctx, 30))
		requireKeyOrder(t, rec, sent)
		require.Eventually(t, func() bool { return countRows(t, s) == 1 }, time.Minute, 20*time.Millisecond, "only the parked message is left")
		diverted := r.Stats().Diverted
		time.Sleep(300 * time.Millisecond) // the reader looks at its held keys every PollInterval
		more := sendKeyed(t, s, []string{"key-0"}, 5)
		require.NoError(t, rec.WaitForUnique(ctx, 35))
		got := rec.ByKey()["key-0"]
		for i, p := range more["key-0"] {
			require.Equal(t, p, string(got[10+i].Payload))
		}
		require.Equal(t, diverted, r.Stats().Diverted, "a released key streams again")
	})
}

// streamOwner reads the stream lease's owner, empty when free or lapsed.
func streamOwner(t testing.TB, s *sqlstore.Store) string {
	t.Helper()
	var owner string
	var exp int64
	err := pool.QueryRow(context.Background(), "SELECT owner, expires_at FROM "+s.Config().LeaseTable+" WHERE bucket = $1", driver.StreamLease).Scan(&owner, &exp)
	if err != nil || time.UnixMicro(exp).Before(time.Now()) {
		return ""
	}
	return owner
}

// Of two relays one reads the stream; a graceful stop hands it to the standby at once,
// a kill after the lease lapses; nothing is lost either way.
func TestOneReaderStandbyTakesOver(t *testing.T) {
	need(t)
	ctx := testContext(t)
	s := open(t, clients[0], sqlstore.Config{})
	rec := outboxtest.NewRecorder()
	relays := map[string]*relay.Relay{}
	for _, id := range []string{"a", "b", "c"} {
		relays[id] = startRelay(t, s, rec, fastRelay(id))
	}
	var reader string
	require.Eventually(t, func() bool { reader = streamOwner(t, s); return reader != "" }, time.Minute, 20*time.Millisecond)
	sendKeyed(t, s, keys(2), 5)
	require.NoError(t, rec.WaitForUnique(ctx, 10))

	// Graceful stop: the standby takes the stream within a few polls.
	stopped := time.Now()
	require.NoError(t, relays[reader].Stop(ctx))
	delete(relays, reader)
	var next string
	require.Eventually(t, func() bool { next = streamOwner(t, s); return next != "" && next != reader }, time.Minute, 10*time.Millisecond)
	t.Logf("stream taken over %s after a graceful stop", time.Since(stopped).Round(time.Millisecond))
	sendKeyed(t, s, keys(2), 5)
	require.NoError(t, rec.WaitForUnique(ctx, 20))

	// Kill: the last standby takes over once the lease lapsed.
	relays[next].Kill()
	delete(relays, next)
	sendKeyed(t, s, keys(2), 5)
	require.NoError(t, rec.WaitForUnique(ctx, 30))
	var last string
	for id := range relays {
		last = id
	}
	require.Equal(t, last, streamOwner(t, s))
}

// killingTransport publishes through rec and, on its nth call, kills the relay after
// the broker took the batch and before the relay could confirm it: the batch must come
// again to the next reader.
type killingTransport struct {
	rec   *outboxtest.Recorder
	calls atomic.Int64
	nth   int64
	kill  func()
}

func (k *killingTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if err := k.rec.Publish(ctx, batch); err != nil {
		return err
	}
	if k.calls.Add(1) == k.nth {
		go k.kill()
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// A relay killed after the broker took a batch and before it confirmed the stream's
// position: the next reader publishes the batch again (duplicates, never a loss).
func TestRelayKilledBeforeConfirmRedelivers(t *testing.T) {
	need(t)
	ctx := testContext(t)
	s := open(t, clients[0], sqlstore.Config{})
	rec := outboxtest.NewRecorder()
	sent := sendKeyed(t, s, keys(4), 25)
	kt := &killingTransport{rec: rec, nth: 3}
	r, err := relay.New(s, kt, fastRelay("doomed"))
	require.NoError(t, err)
	kt.kill = r.Kill
	require.NoError(t, r.Start(ctx))
	<-r.Stopped()
	require.Positive(t, rec.Len())
	startRelay(t, s, rec, fastRelay("next"))
	require.NoError(t, rec.WaitForUnique(ctx, 100))
	requireKeyOrder(t, rec, sent)
	require.Positive(t, rec.Duplicates(), "the unconfirmed batch came again")
}

// A poison message goes to the table lane at once, parked, without cutting short the
// in-place retries of another key that fails for a moment in the same batch.
func TestPoisonDoesNotCutOtherRetriesShort(t *testing.T) {
	need(t)
	ctx := testContext(t)
	s := open(t, clients[0], sqlstore.Config{})
	rec := outboxtest.NewRecorder()
	var flaky atomic.Int64
	rec.FailWhen(func(env *driver.Envelope) error {
		switch string(env.Key) {
		case "poison":
			return driver.Permanent(errors.New("poison"))
		case "flaky":
			if flaky.Add(1) <= 2 {
				return errBrokerDown
			}
		}
		return nil
	})
	cfg := fastRelay("r1")
	cfg.StreamRetryBudget = time.Second
	r := startRelay(t, s, rec, cfg)
	snd := sender(t, s, outbox.Transactional)
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		for _, k := range []string{"poison", "flaky", "poison", "flaky"} {
			if err := snd.Send(ctx, outbox.Message{Topic: "orders", Key: []byte(k), Payload: []byte(k)}); err != nil {
				return err
			}
		}
		return nil
	}))
	require.NoError(t, rec.WaitForUnique(ctx, 2))
	require.Len(t, rec.ByKey()["flaky"], 2, "the flaky key streamed once the broker took it")
	require.Eventually(t, func() bool {
		parked, err := s.Driver().(driver.Admin).List(ctx, driver.Parked, driver.Cursor{}, 10)
		return err == nil && len(parked) == 2
	}, time.Minute, 20*time.Millisecond, "the poison messages are parked in the table (the first by the reader, the second by the bucket's drainer)")
	require.EqualValues(t, 2, r.Stats().Diverted, "the poison key's two messages went to the table, the flaky key's none")
}

// RunOnce and DispatchOne on a log-mode store drain the table lane and leave the
// stream alone (the stream needs the worker): RunOnce publishes what the table holds
// (messages the reader diverted there), DispatchOne the table's message it is given,
// and a message that is only in the log is no row for them, as one already published
// is; the log's messages are still there, unconfirmed, for the reader that comes.
func TestRunOnceAndDispatchOneDrainTheTableLane(t *testing.T) {
	need(t)
	ctx := testContext(t)
	s := open(t, clients[0], sqlstore.Config{})
	inLog := sendKeyed(t, s, []string{"streamed"}, 4)["streamed"]
	logged := message("streamed", 4)
	logged.ID = uuid.New()
	require.NoError(t, sender(t, s, outbox.Immediate).Send(ctx, logged))
	inLog = append(inLog, string(logged.Payload))

	// The table lane, written as the reader diverts: the relay side's Enqueue.
	lane := func(i int) *driver.Envelope {
		env, err := driver.NewEnvelope(message("diverted", i), s.Driver().BucketCount())
		require.NoError(t, err)
		require.NoError(t, s.Driver().Enqueue(ctx, env))
		return env
	}
	for i := range 3 {
		lane(i)
	}
	rec := outboxtest.NewRecorder()
	r, err := relay.New(s, rec, fastRelay("sweeper"))
	require.NoError(t, err)
	res, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Published, "RunOnce published the table lane")
	requireKeyOrder(t, rec, map[string][]string{"diverted": {"diverted-0", "diverted-1", "diverted-2"}})
	require.Zero(t, countRows(t, s))

	last := lane(3)
	res, err = r.DispatchOne(ctx, last.ID)
	require.NoError(t, err)
	require.Equal(t, 1, res.Published, "DispatchOne published the table lane's message")
	res, err = r.DispatchOne(ctx, logged.ID)
	require.NoError(t, err)
	require.Zero(t, res.Published, "a message only in the log is no row to dispatch")
	require.Equal(t, 4, rec.Len())
	require.Empty(t, rec.ByKey()["streamed"])

	// Neither read nor confirmed the stream: the reader gets every logged message.
	envs, _ := readN(t, openStream(t, s), len(inLog))
	var got []string
	for _, e := range envs {
		got = append(got, string(e.Payload))
	}
	require.Equal(t, inLog, got)
}

// records keeps the log records of one message.
type records struct {
	msg string
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == r.msg {
		r.mu.Lock()
		r.got = append(r.got, rec)
		r.mu.Unlock()
	}
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) levels() (warn, debug int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.got {
		switch rec.Level {
		case slog.LevelWarn:
			warn++
		case slog.LevelDebug:
			debug++
		}
	}
	return warn, debug
}

// While a key is held, every batch of the stream that holds one of its messages goes
// to the table lane: through a broker outage, every batch. That is a WARN at most once
// per LeaseRenewInterval, the writes in between DEBUG, as for failed publishes.
func TestTableLaneWritesWarnOncePerInterval(t *testing.T) {
	need(t)
	ctx := testContext(t)
	s := open(t, clients[0], sqlstore.Config{})
	rec := outboxtest.NewRecorder()
	rec.FailWhen(func(env *driver.Envelope) error {
		if string(env.Key) == "down" {
			return errBrokerDown
		}
		return nil
	})
	logged := &records{msg: "relay: messages the broker kept refusing went to the table lane; their keys follow them there until it is drained"}
	cfg := fastRelay("r1")
	// An interval far longer than the run, whatever the machine's load.
	cfg.LeaseDuration, cfg.LeaseRenewInterval = time.Minute, 20*time.Second
	cfg.Logger = slog.New(logged)
	r := startRelay(t, s, rec, cfg)
	snd := sender(t, s, outbox.Immediate)
	// Each message its own batch: the reader diverts it before the next is sent.
	const n = 10
	for i := range n {
		require.NoError(t, snd.Send(ctx, message("down", i)))
		require.Eventually(t, func() bool { return r.Stats().Diverted == int64(i+1) }, time.Minute, 5*time.Millisecond)
	}
	warn, debug := logged.levels()
	require.Equal(t, 1, warn, "one WARN within a LeaseRenewInterval")
	require.Equal(t, n-1, debug, "the writes after it are DEBUG")
}
