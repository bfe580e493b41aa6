package outboxotel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	outboxotel "github.com/outboxkit/outbox/outboxotel"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/memstore"
)

// collect reads every metric the reader holds, by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// has reports whether attrs match want: each key with a non-empty value must be
// present with that value, each key with an empty value absent.
func has(attrs attribute.Set, want map[string]string) bool {
	for k, v := range want {
		got, ok := attrs.Value(attribute.Key(k))
		if v == "" {
			if ok {
				return false
			}
			continue
		}
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sumWhere adds the data points of counter name whose attributes match want.
func sumWhere(t *testing.T, ms map[string]metricdata.Metrics, name string, want map[string]string) int64 {
	t.Helper()
	m, ok := ms[name]
	if !ok {
		return 0 // never incremented
	}
	s, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok, "%s is a %T", name, m.Data)
	var total int64
	for _, dp := range s.DataPoints {
		if has(dp.Attributes, want) {
			total += dp.Value
		}
	}
	return total
}

// gauge adds the points of int64 gauge name whose attributes match want.
func gauge(t *testing.T, ms map[string]metricdata.Metrics, name string, want map[string]string) int64 {
	t.Helper()
	m, ok := ms[name]
	require.True(t, ok, "metric %s not reported", name)
	g, ok := m.Data.(metricdata.Gauge[int64])
	require.True(t, ok, "%s is a %T", name, m.Data)
	require.NotEmpty(t, g.DataPoints, name)
	var total int64
	for _, dp := range g.DataPoints {
		if has(dp.Attributes, want) {
			total += dp.Value
		}
	}
	return total
}

func TestMetricsAfterARealDrain(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })

	obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider, MessagingSystem: "kafka", RelayID: "r1", MaxTopics: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })

	store, err := memstore.New(memstore.Config{BucketCount: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	rec := &topicCounting{Recorder: outboxtest.NewRecorder()}

	// 30 orders, 10 invoices, 5 on a third topic (beyond MaxTopics), one message
	// refused for good and one that fails until it runs out of its 2 attempts.
	var envs []*driver.Envelope
	add := func(topic string, n int, key string) []*driver.Envelope {
		var out []*driver.Envelope
		for i := range n {
			var k []byte
			if key != "" {
				k = []byte(key)
			}
			env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: k, Payload: fmt.Appendf(nil, "%d", i)}, 4)
			require.NoError(t, err)
			env.CreatedAt = env.CreatedAt.Add(-2 * time.Second) // captured two seconds ago
			out = append(out, env)
		}
		envs = append(envs, out...)
		return out
	}
	add("orders", 30, "")
	add("invoices", 10, "")
	add("audit", 5, "")
	bad := add("orders", 1, "bad")[0]
	worse := add("invoices", 1, "worse")[0]
	require.NoError(t, store.Driver().Enqueue(ctx, envs...))
	rec.FailID(bad.ID, driver.Permanent(errors.New("message too large")), -1)
	rec.FailID(worse.ID, errors.New("broker unavailable"), -1)

	d, err := relay.New(store, rec, relay.Config{
		RelayID:            "r1",
		Observer:           obs,
		PollInterval:       20 * time.Millisecond,
		LeaseDuration:      3 * time.Second,
		LeaseRenewInterval: 200 * time.Millisecond,
		BackoffBase:        10 * time.Millisecond,
		BackoffMax:         20 * time.Millisecond,
		MaxAttempts:        2,
		BacklogInterval:    time.Millisecond,
		Logger:             slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(t, err)
	require.NoError(t, d.Start(ctx))
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := d.Stats()
		// Published, parked, and a sample taken after the drain ended.
		if st.Published == 45 && st.Parked == 2 && st.BacklogAt.After(time.Time{}) && st.Backlog.Parked == 2 {
			break
		}
		require.True(t, time.Now().Before(deadline), "drain did not finish: %+v", st)
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, d.Stop(ctx))

	ms := collect(t, reader)
	const sent = "messaging.client.sent.messages"
	// Two topics get their own destination name, the third is counted as _OTHER
	// (which one depends on which bucket drained first).
	want := map[string]int64{"orders": 30, "invoices": 10, "audit": 5}
	named, other := 0, int64(0)
	var missing []string
	for topic, n := range want {
		got := sumWhere(t, ms, sent, map[string]string{"messaging.destination.name": topic, "error.type": "", "messaging.system": "kafka"})
		if got == 0 {
			missing = append(missing, topic)
			other += n
			continue
		}
		named++
		require.Equal(t, n, got, "messages sent to %s", topic)
	}
	require.Equal(t, 2, named, "MaxTopics is 2")
	require.Len(t, missing, 1)
	require.Equal(t, other, sumWhere(t, ms, sent, map[string]string{"messaging.destination.name": outboxotel.OtherTopic, "error.type": ""}), "%s is beyond MaxTopics", missing[0])
	require.Equal(t, int64(1), sumWhere(t, ms, sent, map[string]string{"error.type": "permanent"}), "one permanent failure")
	require.Equal(t, int64(2), sumWhere(t, ms, sent, map[string]string{"error.type": "transient"}), "two failed attempts")

	require.Equal(t, int64(45), sumWhere(t, ms, "outbox.messages.completed", nil))
	require.Equal(t, int64(1), sumWhere(t, ms, "outbox.messages.retried", nil))
	require.Equal(t, int64(1), sumWhere(t, ms, "outbox.messages.parked", map[string]string{"outbox.park.reason": "permanent"}))
	require.Equal(t, int64(1), sumWhere(t, ms, "outbox.messages.parked", map[string]string{"outbox.park.reason": "attempts"}))
	require.Equal(t, d.Stats().Rounds, sumWhere(t, ms, "outbox.coordination.rounds", nil), "every round of the worker")
	require.Equal(t, int64(0), sumWhere(t, ms, "outbox.lease.refused_writes", nil), "a lone relay refuses nothing")

	// The lag of the 45 acknowledged messages: each was captured two seconds before.
	lag := ms["outbox.message.lag"].Data.(metricdata.Histogram[float64])
	var count uint64
	for _, dp := range lag.DataPoints {
		count += dp.Count
		mn, _ := dp.Min.Value()
		require.GreaterOrEqual(t, mn, 2.0)
		mx, _ := dp.Max.Value()
		require.Less(t, mx, 60.0)
	}
	require.Equal(t, uint64(45), count)
	dur := ms["messaging.client.operation.duration"].Data.(metricdata.Histogram[float64])
	var calls uint64
	for _, dp := range dur.DataPoints {
		calls += dp.Count
	}
	require.Equal(t, uint64(rec.callTopics.Load()), calls, "one duration per publish call and topic it carried")

	// Gauges: the relay held every bucket; the last sample found nothing pending
	// and the two parked messages.
	require.Equal(t, int64(4), gauge(t, ms, "outbox.relay.owned_buckets", map[string]string{"outbox.relay.id": "r1"}))
	require.Equal(t, int64(2), gauge(t, ms, "outbox.backlog.parked", nil))
	require.Equal(t, int64(0), gauge(t, ms, "outbox.backlog.pending", nil))
	pend := ms["outbox.backlog.pending"].Data.(metricdata.Gauge[int64])
	require.Len(t, pend.DataPoints, 4, "one point per bucket")
	age := ms["outbox.backlog.oldest_age"].Data.(metricdata.Gauge[float64])
	require.Len(t, age.DataPoints, 1)
	require.Zero(t, age.DataPoints[0].Value, "nothing pending")
	for _, name := range []string{"outbox.stream.lag.bytes", "outbox.stream.lag.age", "outbox.stream.active"} {
		require.NotContains(t, ms, name, "a store without a stream reports no stream gauge")
	}
}

// The stream's gauges report the lag of the store's stream (the SQL store's log mode)
// that a backlog sample carries, and are absent from a sample without one.
func TestStreamGauges(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider, MessagingSystem: "kafka"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	names := []string{"outbox.stream.lag.bytes", "outbox.stream.lag.age", "outbox.stream.active"}

	obs.Backlog(ctx, driver.Backlog{Pending: []int{0, 0}}, time.Now())
	ms := collect(t, reader)
	require.Contains(t, ms, "outbox.backlog.parked")
	for _, name := range names {
		require.NotContains(t, ms, name, "a sample without a stream")
	}

	obs.Backlog(ctx, driver.Backlog{Pending: []int{0, 0}, Stream: &driver.StreamLag{Bytes: 4096, Active: true, Age: 1500 * time.Millisecond}}, time.Now())
	ms = collect(t, reader)
	require.Equal(t, int64(4096), gauge(t, ms, "outbox.stream.lag.bytes", map[string]string{"messaging.system": "kafka"}))
	require.Equal(t, "By", ms["outbox.stream.lag.bytes"].Unit)
	require.Equal(t, int64(1), gauge(t, ms, "outbox.stream.active", nil))
	age := ms["outbox.stream.lag.age"]
	require.Equal(t, "s", age.Unit)
	points := age.Data.(metricdata.Gauge[float64]).DataPoints
	require.Len(t, points, 1)
	require.Equal(t, 1.5, points[0].Value)

	// No reader: the slot is kept, its reader gone.
	obs.Backlog(ctx, driver.Backlog{Pending: []int{0, 0}, Stream: &driver.StreamLag{Bytes: 1 << 20}}, time.Now())
	ms = collect(t, reader)
	require.Equal(t, int64(1<<20), gauge(t, ms, "outbox.stream.lag.bytes", nil))
	require.Equal(t, int64(0), gauge(t, ms, "outbox.stream.active", nil))

	// A sample older than BacklogTTL is no longer reported, the stream's neither.
	obs.Backlog(ctx, driver.Backlog{Pending: []int{0, 0}, Stream: &driver.StreamLag{Bytes: 1}}, time.Now().Add(-2*outboxotel.DefaultBacklogTTL))
	ms = collect(t, reader)
	for _, name := range names {
		require.NotContains(t, ms, name, "a stale sample")
	}
}

// topicCounting counts, over every Publish call, the distinct topics each carried.
type topicCounting struct {
	*outboxtest.Recorder
	callTopics atomic.Int64
}

func (c *topicCounting) Publish(ctx context.Context, batch []*driver.Envelope) error {
	topics := map[string]bool{}
	for _, e := range batch {
		topics[e.Topic] = true
	}
	c.callTopics.Add(int64(len(topics)))
	return c.Recorder.Publish(ctx, batch)
}

// In one call where one message fails for good and another for now, each is counted
// with its own outcome, and the call's duration is recorded under each topic with
// that topic's own outcome.
func TestEachMessageAndTopicGetsItsOwnOutcome(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })

	env := func(topic string) *driver.Envelope {
		e, err := driver.NewEnvelope(outbox.Message{Topic: topic, Payload: []byte("x")}, 4)
		require.NoError(t, err)
		return e
	}
	good, tooBig, later := env("orders"), env("orders"), env("invoices")
	batch := []*driver.Envelope{good, tooBig, later}
	perr := &driver.PublishError{Failed: []driver.MessageError{
		{ID: tooBig.ID, Err: driver.Permanent(errors.New("message too large"))},
		{ID: later.ID, Err: errors.New("leader not available")},
	}}
	obs.Published(ctx, batch, []*driver.Envelope{good}, time.Now(), 5*time.Millisecond, perr)

	ms := collect(t, reader)
	const sent = "messaging.client.sent.messages"
	send := map[string]string{"messaging.operation.name": "send"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range send {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	require.Equal(t, int64(1), sumWhere(t, ms, sent, with("messaging.destination.name", "orders", "error.type", "")))
	require.Equal(t, int64(1), sumWhere(t, ms, sent, with("messaging.destination.name", "orders", "error.type", "permanent")))
	require.Equal(t, int64(1), sumWhere(t, ms, sent, with("messaging.destination.name", "invoices", "error.type", "transient")),
		"the transient failure is not labelled permanent")
	require.Equal(t, int64(3), sumWhere(t, ms, sent, send), "every point names the operation")

	dur := ms["messaging.client.operation.duration"].Data.(metricdata.Histogram[float64])
	got := map[string]string{}
	for _, dp := range dur.DataPoints {
		topic, _ := dp.Attributes.Value("messaging.destination.name")
		typ, _ := dp.Attributes.Value("error.type")
		require.Equal(t, uint64(1), dp.Count)
		got[topic.AsString()] = typ.AsString()
	}
	require.Equal(t, map[string]string{"orders": "permanent", "invoices": "transient"}, got, "one duration per topic, with its own outcome")
}

// Counters of rare events are there at zero before the first event, so an alert
// can be written against them.
func TestRareCountersStartAtZero(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	ms := collect(t, reader)
	for _, name := range []string{"outbox.messages.deleted", "outbox.lease.refused_writes", "outbox.relay.instance_clashes"} {
		m, ok := ms[name]
		require.True(t, ok, "%s exists before its first event", name)
		s := m.Data.(metricdata.Sum[int64])
		require.NotEmpty(t, s.DataPoints, name)
		for _, dp := range s.DataPoints {
			require.Zero(t, dp.Value, name)
		}
	}
	refused := ms["outbox.lease.refused_writes"].Data.(metricdata.Sum[int64])
	require.Len(t, refused.DataPoints, 5, "one series per conditional write")
}

// A clash of relay instances (two processes under one relay ID) counts once per
// report, with no attribute per instance.
func TestInstanceClashesAreCounted(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(ctx) })
	obs, err := outboxotel.New(outboxotel.Config{MeterProvider: provider})
	require.NoError(t, err)
	t.Cleanup(func() { _ = obs.Close() })
	self := driver.Instance{Host: "a", PID: 1, Nonce: "1"}
	for _, other := range []driver.Instance{{Host: "b", PID: 2, Nonce: "2"}, {Host: "c", PID: 3, Nonce: "3"}} {
		obs.InstanceClash(ctx, self, other)
	}
	ms := collect(t, reader)
	s := ms["outbox.relay.instance_clashes"].Data.(metricdata.Sum[int64])
	require.Len(t, s.DataPoints, 1, "one series, whatever the instances")
	require.Equal(t, int64(2), s.DataPoints[0].Value)
}
