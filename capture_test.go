package outbox_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

func newStore(t *testing.T, cfg memstore.Config) *memstore.Store {
	t.Helper()
	st, err := memstore.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func newSender(t *testing.T, st outbox.Store, cfg outbox.SenderConfig) outbox.Sender {
	t.Helper()
	c, err := outbox.NewSender(st, cfg)
	require.NoError(t, err)
	return c
}

func pending(t *testing.T, st *memstore.Store) int {
	t.Helper()
	stats, err := st.Driver().(driver.Admin).Stats(context.Background())
	require.NoError(t, err)
	n := 0
	for _, p := range stats.Pending {
		n += p
	}
	return n
}

func TestSenderConfigValidate(t *testing.T) {
	t.Parallel()
	st := newStore(t, memstore.Config{})
	_, err := outbox.NewSender(st, outbox.SenderConfig{Mode: 7})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "SenderConfig.Mode")
	_, err = outbox.NewSender(st, outbox.SenderConfig{MaxMessageSize: -1})
	require.ErrorContains(t, err, "SenderConfig.MaxMessageSize")
	_, err = outbox.NewSender(nil, outbox.SenderConfig{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
}

// Outside a unit of work the default mode fails at Send; Immediate writes at once.
func TestSendOutsideAUnitOfWork(t *testing.T) {
	t.Parallel()
	st := newStore(t, memstore.Config{})
	ctx := context.Background()
	send := newSender(t, st, outbox.SenderConfig{})
	err := send.Send(ctx, outbox.Message{Topic: "orders"})
	require.ErrorIs(t, err, outbox.ErrNoTransaction)
	require.Contains(t, err.Error(), `"orders"`)
	require.Zero(t, pending(t, st))

	immediate := newSender(t, st, outbox.SenderConfig{Mode: outbox.Immediate})
	require.NoError(t, immediate.Send(ctx, outbox.Message{Topic: "orders"}))
	require.Equal(t, 1, pending(t, st))
}

// Capture refuses what the store or the transport can never carry, before writing.
func TestSendSizeLimits(t *testing.T) {
	t.Parallel()
	st := newStore(t, memstore.Config{MaxMessageSize: 1000})
	ctx := context.Background()
	body := func(n int) outbox.Message { return outbox.Message{Topic: "t", Payload: make([]byte, n)} }

	byStore := newSender(t, st, outbox.SenderConfig{Mode: outbox.Immediate})
	require.ErrorIs(t, byStore.Send(ctx, body(1000)), outbox.ErrTooLarge, "the store's limit (its Size counts the topic too)")

	transport := limited{outboxtest.NewRecorder(), 500}
	byTransport := newSender(t, st, outbox.SenderConfig{Mode: outbox.Immediate, Transport: transport})
	err := byTransport.Send(ctx, body(600))
	require.ErrorIs(t, err, outbox.ErrTooLarge, "the transport's smaller limit wins")
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.NoError(t, byTransport.Send(ctx, body(400)))

	byConfig := newSender(t, st, outbox.SenderConfig{Mode: outbox.Immediate, Transport: transport, MaxMessageSize: 100})
	require.ErrorIs(t, byConfig.Send(ctx, body(200)), outbox.ErrTooLarge, "the configured limit, smaller still")

	// A store behind a wrapper keeps its limit: the sender looks through Unwrap.
	behind := newSender(t, unwrapping{st}, outbox.SenderConfig{Mode: outbox.Immediate})
	require.ErrorIs(t, behind.Send(ctx, body(1000)), outbox.ErrTooLarge)
	require.Equal(t, 1, pending(t, st), "only the message within every limit was written")
}

// limited gives a transport a per-message limit, as the Kafka and SQS transports have.
type limited struct {
	driver.Transport
	n int
}

func (l limited) MaxMessageSize() int { return l.n }

func TestSendRefusesInvalidTopics(t *testing.T) {
	t.Parallel()
	st := newStore(t, memstore.Config{})
	send := newSender(t, st, outbox.SenderConfig{Mode: outbox.Immediate})
	for _, topic := range []string{"", "nul\x00inside", "bad\xffutf8"} {
		require.ErrorIs(t, send.Send(context.Background(), outbox.Message{Topic: topic}), outbox.ErrInvalidMessage, "topic %q", topic)
	}
	require.Zero(t, pending(t, st))
}

// An application that commits its own transaction stages on a scope of its own; what
// no transaction took is reported through the sender's logger, not a global one.
func TestScopeReleaseReportsAbandonedThroughTheSendersLogger(t *testing.T) {
	t.Parallel()
	st := newStore(t, memstore.Config{})
	var logs bytes.Buffer
	send := newSender(t, st, outbox.SenderConfig{Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	ctx, scope := outbox.NewScope(context.Background())
	require.NoError(t, send.Send(ctx, outbox.Message{Topic: "a"}))
	require.NoError(t, send.Send(ctx, outbox.Message{Topic: "b"}))
	require.Equal(t, 2, scope.Len())
	require.Equal(t, 2, scope.Release())
	require.Contains(t, logs.String(), "level=WARN")
	require.Contains(t, logs.String(), "messages=2")
	require.Zero(t, scope.Release(), "a second release is harmless")
	require.ErrorIs(t, send.Send(ctx, outbox.Message{Topic: "c"}), outbox.ErrClosed)

	// A scope whose envelopes a transaction took is released quietly.
	ctx, scope = outbox.NewScope(context.Background())
	require.NoError(t, send.Send(ctx, outbox.Message{Topic: "a"}))
	envs, err := driver.Take(ctx, 8)
	require.NoError(t, err)
	require.Len(t, envs, 1)
	require.NoError(t, st.Driver().Enqueue(ctx, envs...))
	require.Zero(t, scope.Release())
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"))
}

// Units of work of different stores nest; a unit of the same store is a savepoint of
// its outer unit even with another store's unit in between.
func TestNestedUnitsOfDifferentStores(t *testing.T) {
	t.Parallel()
	a, b := newStore(t, memstore.Config{BucketCount: 1}), newStore(t, memstore.Config{BucketCount: 1})
	toA, toB := newSender(t, a, outbox.SenderConfig{}), newSender(t, b, outbox.SenderConfig{})
	boom := errors.New("outer failed")
	err := a.Transact(context.Background(), func(ctx context.Context) error {
		require.NoError(t, b.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, toB.Send(ctx, outbox.Message{Topic: "b"}))
			return a.Transact(ctx, func(ctx context.Context) error {
				return toA.Send(ctx, outbox.Message{Topic: "a"})
			})
		}))
		require.Equal(t, 1, pending(t, b), "b's unit committed on its own")
		require.Zero(t, pending(t, a), "a's inner unit is a savepoint of the outer one")
		return boom
	})
	require.ErrorIs(t, err, boom)
	require.Zero(t, pending(t, a), "and rolled back with it")
}

// A sender joins only a unit of work of its own store: inside another store's unit
// alone, a send is a wiring mistake, not a message written to the wrong store.
func TestSendInsideAnotherStoresUnitOfWork(t *testing.T) {
	t.Parallel()
	a, b := newStore(t, memstore.Config{BucketCount: 1}), newStore(t, memstore.Config{BucketCount: 1})
	toA := newSender(t, a, outbox.SenderConfig{Mode: outbox.Immediate})
	err := b.Transact(context.Background(), func(ctx context.Context) error {
		return toA.Send(ctx, outbox.Message{Topic: "a"})
	})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "another store")
	require.Zero(t, pending(t, a))
	require.Zero(t, pending(t, b))

	// Inside its own store's unit, with another store's unit in between, it joins its
	// own: written when a's unit commits.
	require.NoError(t, a.Transact(context.Background(), func(ctx context.Context) error {
		return b.Transact(ctx, func(ctx context.Context) error {
			require.NoError(t, toA.Send(ctx, outbox.Message{Topic: "a"}))
			require.Zero(t, pending(t, a), "staged on a's unit, not written yet")
			return nil
		})
	}))
	require.Equal(t, 1, pending(t, a))
	require.Zero(t, pending(t, b))

	// A wrapper that unwraps to the store joins the store's units.
	wrapped := newSender(t, unwrapping{a}, outbox.SenderConfig{})
	require.NoError(t, a.Transact(context.Background(), func(ctx context.Context) error {
		return wrapped.Send(ctx, outbox.Message{Topic: "a"})
	}))
	require.Equal(t, 2, pending(t, a))
}

type unwrapping struct{ outbox.Store }

func (u unwrapping) Unwrap() outbox.Store { return u.Store }

// A unit of work begun on a ctx that carries an application's scope takes the
// messages staged on it: they commit with the unit, instead of being reported only at
// Release.
func TestTransactTakesWhatAScopeHolds(t *testing.T) {
	t.Parallel()
	st := newStore(t, memstore.Config{BucketCount: 1})
	send := newSender(t, st, outbox.SenderConfig{})
	ctx, scope := outbox.NewScope(context.Background())
	require.NoError(t, send.Send(ctx, outbox.Message{Topic: "before"}))
	require.NoError(t, st.Transact(ctx, func(ctx context.Context) error {
		return send.Send(ctx, outbox.Message{Topic: "inside"})
	}))
	require.Equal(t, 2, pending(t, st))
	require.Zero(t, scope.Release(), "nothing is left to abandon")

	ctx, scope = outbox.NewScope(context.Background())
	require.NoError(t, send.Send(ctx, outbox.Message{Topic: "before"}))
	require.Error(t, st.Transact(ctx, func(context.Context) error { return errors.New("rolled back") }))
	require.Equal(t, 2, pending(t, st), "a rolled-back unit takes them with it")
	require.Zero(t, scope.Release())
}

// Capture keeps a Message.ID the application set and gives a zero one a UUIDv7 of
// its own; it stores the message's headers as they are, adding no idempotency key
// (the transports stamp it at publish, and Config.OmitIdempotencyKey is theirs).
func TestSendKeepsTheCallersIDAndAddsNoHeaders(t *testing.T) {
	t.Parallel()
	st := newStore(t, memstore.Config{BucketCount: 1})
	send := newSender(t, st, outbox.SenderConfig{})
	ctx := context.Background()
	chosen := uuid.MustParse("6f1c2a4e-3b9d-4c1e-9a7f-2d5e8b0c4a11") // a v4: not what capture draws
	require.NoError(t, st.Transact(ctx, func(ctx context.Context) error {
		if err := send.Send(ctx, outbox.Message{ID: chosen, Topic: "t", Key: []byte("k"), Payload: []byte("chosen")}); err != nil {
			return err
		}
		return send.Send(ctx, outbox.Message{Topic: "t", Payload: []byte("drawn"), Headers: []outbox.Header{{Key: "a", Value: []byte("1")}}})
	}))
	batch, err := st.Driver().Fetch(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, batch.Envelopes, 2)
	byPayload := map[string]*driver.Envelope{}
	for _, env := range batch.Envelopes {
		byPayload[string(env.Payload)] = env
	}
	require.Equal(t, chosen, byPayload["chosen"].ID, "the caller's ID")
	require.Empty(t, byPayload["chosen"].Headers)
	drawn := byPayload["drawn"]
	require.EqualValues(t, 7, drawn.ID.Version(), "a zero ID gets a UUIDv7")
	require.Equal(t, []outbox.Header{{Key: "a", Value: []byte("1")}}, drawn.Headers, "no idempotency key, nor any other header, is added")
}
