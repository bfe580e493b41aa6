package relaysuite

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

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// consume publishes keyed messages, a copy of one (as a relay's retry does) and, if
// the harness can, a message the outbox did not write, then consumes the topic
// through the transport's source with an inbox consumer whose handler refuses one
// message twice: every message is applied once, in its key's order, the copy is a
// duplicate (unless the broker dropped it), and the broker holds nothing
// unacknowledged once the consumer stopped.
func (s suite) consume(t *testing.T) {
	if s.h.Source == nil {
		t.Skip("the harness has no Source")
	}
	const keys, perKey = 3, 10
	topic := topicName("consume")
	tr := s.h.New(t, topic, nil)
	src := s.h.Source(t, topic)

	byKey := make([][]*driver.Envelope, keys)
	for k := range byKey {
		for i := range perKey {
			env, err := driver.NewEnvelope(outbox.Message{
				Topic: topic, Key: fmt.Appendf(nil, "k%d", k), Payload: fmt.Appendf(nil, "k%d-%02d", k, i),
			}, Buckets)
			require.NoError(t, err)
			byKey[k] = append(byKey[k], env)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for _, envs := range byKey {
		require.NoError(t, tr.Publish(ctx, envs[:5]))
	}
	if s.h.Foreign != nil {
		s.h.Foreign(t, topic)
	}
	// A retry of the first key's last batch publishes its first message again.
	require.NoError(t, tr.Publish(ctx, byKey[0][4:]))
	for _, envs := range byKey[1:] {
		require.NoError(t, tr.Publish(ctx, envs[5:]))
	}

	a := &applied{Ledger: outboxtest.NewLedger(), refuse: "k1-03", refusals: 2}
	stopConsumer := a.run(t, src)
	wantDups := 1
	if s.h.Features.Deduplicates {
		wantDups = 0
	}
	waitFor(t, "every message applied and the copy seen", func() bool {
		n, dups := a.progress()
		return n == keys*perKey && dups >= wantDups
	})
	stopConsumer()

	times, order := a.Snapshot()
	for _, envs := range byKey {
		var want []string
		for _, env := range envs {
			want = append(want, string(env.Payload))
			assert.Equal(t, 1, times[env.ID.String()], "message %s applied once", env.Payload)
		}
		if s.h.Features.Ordered {
			assert.Equal(t, want, order[string(envs[0].Key)], "key %s applied in publish order, the refused message retried in its place", envs[0].Key)
		}
	}
	assert.Equal(t, wantDups, a.dups, "duplicates found")
	assert.Zero(t, a.refusals, "the refused message was retried until the handler took it")
	if s.h.Settled != nil {
		s.h.Settled(t, topic)
	}
}

// applied is the consumer's ledger, a handler that refuses one payload a few times
// first, and the duplicates the consumer found.
type applied struct {
	*outboxtest.Ledger
	mu       sync.Mutex
	dups     int
	refuse   string
	refusals int
}

func (a *applied) handle(ctx context.Context, d *inbox.Delivery) error {
	a.mu.Lock()
	if string(d.Payload) == a.refuse && a.refusals > 0 {
		a.refusals--
		a.mu.Unlock()
		return fmt.Errorf("the handler refuses %s for now", d.Payload)
	}
	a.mu.Unlock()
	return a.Apply(ctx, d)
}

func (a *applied) processed(_ *inbox.Delivery, res inbox.Result) {
	if res.Duplicate {
		a.mu.Lock()
		a.dups++
		a.mu.Unlock()
	}
}

func (a *applied) progress() (applied, dups int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.Len(), a.dups
}

// run runs an inbox consumer on src over a memory store, and returns a function that
// stops it and requires Run to return nil (also called at cleanup).
func (a *applied) run(t *testing.T, src inbox.Source) (stop func()) {
	t.Helper()
	st, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	in, err := inbox.New(st, inbox.Config{Consumer: "billing", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	c, err := inbox.NewConsumer(src, in, a.handle, inbox.ConsumerConfig{
		RetryBackoff: 10 * time.Millisecond, Processed: a.processed, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	run := outboxtest.RunConsumer(t, c)
	return func() { require.NoError(t, run(), "Run returns nil once its ctx ends") }
}

// consumeStopsGracefully stops a consumer while a delivery is in its handler: Run
// waits for it, starts no other delivery, and returns nil once what was in progress
// was applied and acknowledged. A consumer on a fresh source for the same consumer
// (a restart) then gets exactly what the first did not apply, and a message
// published since: nothing the first acknowledged comes again, and the broker holds
// nothing unacknowledged once it stopped (Harness.Settled).
func (s suite) consumeStopsGracefully(t *testing.T) {
	if s.h.Source == nil {
		t.Skip("the harness has no Source")
	}
	topic := topicName("consume-stop")
	tr := s.h.New(t, topic, nil)
	src := s.h.Source(t, topic)
	// One key: a lane, where the broker has lanes.
	var envs []*driver.Envelope
	for i := range 3 {
		envs = append(envs, envelope(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: fmt.Appendf(nil, "%d", i)}))
	}
	require.NoError(t, publish(tr, envs...))

	st, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	in, err := inbox.New(st, inbox.Config{Consumer: "billing", Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	first := outboxtest.NewLedger()
	entered, release := make(chan struct{}), make(chan struct{})
	var enter sync.Once
	var started atomic.Int64
	c, err := inbox.NewConsumer(src, in, func(ctx context.Context, d *inbox.Delivery) error {
		started.Add(1)
		enter.Do(func() { close(entered) })
		<-release
		return first.Apply(ctx, d)
	}, inbox.ConsumerConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-entered:
	case <-time.After(within):
		close(release)
		t.Fatalf("no delivery reached the handler within %s", within)
	}
	cancel() // stop while a delivery is in its handler
	select {
	case err := <-done:
		close(release)
		t.Fatalf("Run returned (%v) while a delivery was in its handler", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-done:
		require.NoError(t, err, "Run returns nil once its ctx ends")
	case <-time.After(callTimeout):
		t.Fatalf("Run did not return within %s of the delivery in progress finishing", callTimeout)
	}
	first.RequireOnce(t, int(started.Load()))
	took, _ := first.Snapshot()
	if s.h.Features.Ordered {
		require.Equal(t, map[string]int{envs[0].ID.String(): 1}, took, "the key's first message was applied and no further delivery started")
	}

	// The restart: what the first consumer did not apply, then a message published
	// since (so the second consumer has something to wait for, which comes after
	// whatever an unacknowledged delivery left with the broker).
	tail := envelope(t, outbox.Message{Topic: topic, Key: []byte("k"), Payload: []byte("tail")})
	want := map[string]int{tail.ID.String(): 1}
	for _, env := range envs {
		if took[env.ID.String()] == 0 {
			want[env.ID.String()] = 1
		}
	}
	second := &applied{Ledger: outboxtest.NewLedger()}
	stopSecond := second.run(t, s.h.Source(t, topic))
	require.NoError(t, publish(tr, tail))
	waitFor(t, "the restarted consumer to apply what the first did not", func() bool { return second.Len() >= len(want) })
	stopSecond()
	got, _ := second.Snapshot()
	require.Equal(t, want, got, "the restarted consumer gets exactly what the first did not apply: nothing the first acknowledged comes again")
	if s.h.Settled != nil {
		s.h.Settled(t, topic)
	}
}
