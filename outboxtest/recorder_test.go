package outboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

func envelope(t testing.TB, key, payload string) *driver.Envelope {
	t.Helper()
	msg := outbox.Message{Topic: "t", Payload: []byte(payload)}
	if key != "" {
		msg.Key = []byte(key)
	}
	env, err := driver.NewEnvelope(msg, driver.DefaultBucketCount)
	require.NoError(t, err)
	return env
}

func TestRecorderRecordsInOrderAndCountsDuplicates(t *testing.T) {
	t.Parallel()
	r := outboxtest.NewRecorder()
	ctx := context.Background()
	a, b, c := envelope(t, "k1", "a"), envelope(t, "k2", "b"), envelope(t, "k1", "c")
	require.NoError(t, r.Publish(ctx, []*driver.Envelope{a, b}))
	require.NoError(t, r.Publish(ctx, []*driver.Envelope{c, a}))

	require.Equal(t, 4, r.Len())
	require.Equal(t, 3, r.Unique())
	require.Equal(t, 1, r.Duplicates())
	require.Equal(t, 2, r.Count(a.ID))
	require.Equal(t, 2, r.Batches())
	msgs := r.Messages()
	require.Equal(t, []string{"a", "b", "c", "a"}, []string{string(msgs[0].Payload), string(msgs[1].Payload), string(msgs[2].Payload), string(msgs[3].Payload)})

	byKey := r.ByKey()
	require.Len(t, byKey["k1"], 2, "redeliveries are left out")
	require.Equal(t, a.ID, byKey["k1"][0].ID)
	require.Equal(t, c.ID, byKey["k1"][1].ID)

	// The recorder keeps its own copy.
	a.Payload[0] = 'X'
	require.Equal(t, "a", string(r.Messages()[0].Payload))

	r.Reset()
	require.Zero(t, r.Len())
	require.Zero(t, r.Duplicates())
}

func TestRecorderFailures(t *testing.T) {
	t.Parallel()
	r := outboxtest.NewRecorder()
	ctx := context.Background()
	a, b, c := envelope(t, "k", "a"), envelope(t, "k", "b"), envelope(t, "", "c")
	transient := errors.New("try later")
	r.FailID(a.ID, transient, 2)
	r.FailID(b.ID, driver.Permanent(errors.New("too big")), -1)
	r.FailWhen(func(env *driver.Envelope) error {
		if env.Key == nil {
			return transient
		}
		return nil
	})

	for attempt := range 3 {
		err := r.Publish(ctx, []*driver.Envelope{a, b, c})
		var pe *driver.PublishError
		require.ErrorAs(t, err, &pe)
		failed := map[string]error{}
		for _, f := range pe.Failed {
			failed[f.ID.String()] = f.Err
		}
		if attempt < 2 {
			require.ErrorIs(t, failed[a.ID.String()], transient)
		} else {
			require.NotContains(t, failed, a.ID.String(), "FailID with times=2 fails twice only")
		}
		require.True(t, driver.IsPermanent(failed[b.ID.String()]))
		require.False(t, driver.IsPermanent(failed[c.ID.String()]))
	}
	require.Equal(t, 1, r.Len())
	require.Equal(t, a.ID, r.Messages()[0].ID)

	r.FailWhen(nil)
	r.FailID(b.ID, nil, 0)
	require.NoError(t, r.Publish(ctx, []*driver.Envelope{b, c}))
	require.Equal(t, 3, r.Len())
}

func TestRecorderWaitFor(t *testing.T) {
	t.Parallel()
	r := outboxtest.NewRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			if err := r.Publish(ctx, []*driver.Envelope{envelope(t, "k", string(rune('a'+i)))}); err != nil {
				t.Error(err)
			}
		})
	}
	require.NoError(t, r.WaitFor(ctx, 10))
	wg.Wait()

	short, stop := context.WithTimeout(ctx, 10*time.Millisecond)
	defer stop()
	require.ErrorIs(t, r.WaitFor(short, 11), context.DeadlineExceeded)
}

func TestRecorderCancelledContext(t *testing.T) {
	t.Parallel()
	r := outboxtest.NewRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, r.Publish(ctx, []*driver.Envelope{envelope(t, "k", "a")}), context.Canceled)
	require.Zero(t, r.Len())
}

func TestFaultTransportValidates(t *testing.T) {
	t.Parallel()
	_, err := outboxtest.NewFaultTransport(outboxtest.NewRecorder(), outboxtest.Faults{MessageErrorRate: 2})
	require.ErrorContains(t, err, "MessageErrorRate")
	_, err = outboxtest.NewFaultTransport(nil, outboxtest.Faults{})
	require.Error(t, err)
}

func TestFaultTransportMessageErrorsAreDeterministic(t *testing.T) {
	t.Parallel()
	batch := make([]*driver.Envelope, 200)
	for i := range batch {
		batch[i] = envelope(t, "k", "p")
	}
	run := func() ([]string, int) {
		rec := outboxtest.NewRecorder()
		ft, err := outboxtest.NewFaultTransport(rec, outboxtest.Faults{MessageErrorRate: 0.3, Seed: 42})
		require.NoError(t, err)
		err = ft.Publish(context.Background(), batch)
		var pe *driver.PublishError
		require.ErrorAs(t, err, &pe)
		var ids []string
		for _, f := range pe.Failed {
			require.ErrorIs(t, f.Err, outboxtest.ErrInjected)
			require.False(t, driver.IsPermanent(f.Err))
			require.Zero(t, rec.Count(f.ID), "a failed message is not passed on")
			ids = append(ids, f.ID.String())
		}
		require.Equal(t, len(batch), len(pe.Failed)+rec.Len())
		require.Equal(t, len(pe.Failed), ft.Injected())
		return ids, rec.Len()
	}
	first, delivered := run()
	second, _ := run()
	require.Equal(t, first, second, "one seed, one sequence of faults")
	require.InDelta(t, 60, len(first), 30, "about 30%% of 200 fail")
	require.Positive(t, delivered)
}

func TestFaultTransportMergesInnerFailures(t *testing.T) {
	t.Parallel()
	rec := outboxtest.NewRecorder()
	a, b := envelope(t, "k", "a"), envelope(t, "k", "b")
	rec.FailID(b.ID, driver.Permanent(errors.New("rejected")), -1)
	ft, err := outboxtest.NewFaultTransport(rec, outboxtest.Faults{MessageErrorRate: 1e-9})
	require.NoError(t, err)
	err = ft.Publish(context.Background(), []*driver.Envelope{a, b})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	require.Equal(t, b.ID, pe.Failed[0].ID)
	require.True(t, driver.IsPermanent(pe.Failed[0].Err))
}

func TestFaultTransportOutages(t *testing.T) {
	t.Parallel()
	rec := outboxtest.NewRecorder()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := now
	var mu sync.Mutex
	ft, err := outboxtest.NewFaultTransport(rec, outboxtest.Faults{
		OutageStart: now.Add(time.Minute),
		OutageEnd:   now.Add(2 * time.Minute),
		Now: func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return clock
		},
	})
	require.NoError(t, err)
	ctx := context.Background()
	publish := func() error { return ft.Publish(ctx, []*driver.Envelope{envelope(t, "k", "p")}) }
	setClock := func(t time.Time) { mu.Lock(); clock = t; mu.Unlock() }

	require.NoError(t, publish())
	setClock(now.Add(90 * time.Second))
	require.ErrorIs(t, publish(), outboxtest.ErrOutage)
	setClock(now.Add(2 * time.Minute))
	require.NoError(t, publish())

	ft.SetDown(true)
	err = publish()
	require.ErrorIs(t, err, outboxtest.ErrInjected)
	var pe *driver.PublishError
	require.False(t, errors.As(err, &pe), "an outage fails the whole batch")
	ft.SetDown(false)
	require.NoError(t, publish())
	require.Equal(t, 3, rec.Len())
	require.Equal(t, 2, ft.Injected())
}

func TestFaultTransportBatchErrorsAndLatency(t *testing.T) {
	t.Parallel()
	rec := outboxtest.NewRecorder()
	ft, err := outboxtest.NewFaultTransport(rec, outboxtest.Faults{BatchErrorRate: 1, Latency: 20 * time.Millisecond})
	require.NoError(t, err)
	require.ErrorIs(t, ft.Publish(context.Background(), []*driver.Envelope{envelope(t, "k", "p")}), outboxtest.ErrInjected)
	require.Zero(t, rec.Len())

	// Latency honours the context: a deadline shorter than the latency cuts it off.
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	require.ErrorIs(t, ft.Publish(ctx, []*driver.Envelope{envelope(t, "k", "p")}), context.DeadlineExceeded)
}

func TestRecorderCountOnly(t *testing.T) {
	t.Parallel()
	r := &outboxtest.Recorder{CountOnly: true}
	ctx := context.Background()
	a, b := envelope(t, "k", "a"), envelope(t, "k", "b")
	require.NoError(t, r.Publish(ctx, []*driver.Envelope{a, b, a}))
	require.Equal(t, 3, r.Len())
	require.Equal(t, 2, r.Unique())
	require.Equal(t, 1, r.Duplicates())
	require.Equal(t, 2, r.Count(a.ID))
	require.Empty(t, r.Messages())
	require.NoError(t, r.WaitFor(ctx, 3))
}

func BenchmarkRecorderPublish(b *testing.B) {
	const batch = 100
	for _, countOnly := range []bool{false, true} {
		b.Run(fmt.Sprintf("countOnly=%v", countOnly), func(b *testing.B) {
			envs := make([]*driver.Envelope, batch)
			for i := range envs {
				envs[i] = envelope(b, "key", "payload of a typical size, a few dozen bytes long")
			}
			r := &outboxtest.Recorder{CountOnly: countOnly}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := r.Publish(ctx, envs); err != nil {
					b.Fatal(err)
				}
				if r.Len() >= 1_000_000 {
					r.Reset()
				}
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
