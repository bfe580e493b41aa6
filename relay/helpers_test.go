package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/memstore"
)

// clock is a settable clock for the Now hook.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: epoch} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// offset is a relay's own clock: the shared clock plus a skew.
func (c *clock) offset(skew *time.Duration, mu *sync.Mutex) func() time.Time {
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return c.Now().Add(*skew)
	}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newStore(t *testing.T, buckets int) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{BucketCount: buckets})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// memDriver is the memory store's relay side with the optional capabilities it
// offers, for test wrappers that override some calls and keep the rest.
type memDriver interface {
	driver.Store
	driver.Admin
	driver.Finder
	driver.Retainer
	driver.Notifier
}

// relaySide returns s's relay side with its optional capabilities.
func relaySide(s *memstore.Store) memDriver { return s.Driver().(memDriver) }

// find looks id up on s's relay side.
func find(ctx context.Context, s *memstore.Store, id uuid.UUID) (*driver.Envelope, error) {
	return relaySide(s).Find(ctx, id)
}

// testConfig is a config on the fake clock with jitter off.
func testConfig(c *clock, id string) Config {
	return Config{
		RelayID:     id,
		Jitter:      -1,
		BackoffBase: time.Second,
		BackoffMax:  time.Minute,
		Logger:      quietLogger(),
		Now:         c.Now,
	}
}

func newDispatcher(t *testing.T, store driver.Handle, tr driver.Transport, cfg Config) *Relay {
	t.Helper()
	d, err := New(store, tr, cfg)
	require.NoError(t, err)
	return d
}

// enqueue writes n messages with key (nil for keyless) and returns them in order.
func enqueue(t *testing.T, handle driver.Handle, key []byte, n int) []*driver.Envelope {
	t.Helper()
	store := handle.Driver()
	envs := make([]*driver.Envelope, n)
	for i := range envs {
		env, err := driver.NewEnvelope(outbox.Message{
			Topic:   "orders",
			Key:     key,
			Payload: fmt.Appendf(nil, "%s-%d", key, i),
		}, store.BucketCount())
		require.NoError(t, err)
		envs[i] = env
	}
	require.NoError(t, store.Enqueue(context.Background(), envs...))
	return envs
}

func pending(t *testing.T, s *memstore.Store) int {
	t.Helper()
	st, err := relaySide(s).Stats(context.Background())
	require.NoError(t, err)
	total := 0
	for _, n := range st.Pending {
		total += n
	}
	return total
}

// idsOf returns the IDs of envs.
func idsOf(envs []*driver.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = e.ID.String()
	}
	return out
}

// requireKeyOrder checks that first deliveries of every key follow Seq order.
func requireKeyOrder(t *testing.T, rec *outboxtest.Recorder) {
	t.Helper()
	for key, envs := range rec.ByKey() {
		for i := 1; i < len(envs); i++ {
			require.Less(t, envs[i-1].Seq, envs[i].Seq, "key %q delivered out of order", key)
		}
	}
}

// logRecord is one log record, with the attributes of the logger it went through.
type logRecord struct {
	Level slog.Level
	Msg   string
	Attrs map[string]slog.Value
}

// logSink records every log record, at every level.
type logSink struct {
	mu      sync.Mutex
	records []logRecord
}

func (s *logSink) Logger() *slog.Logger { return slog.New(&sinkHandler{sink: s}) }

// Records returns the records logged so far with a message containing msg.
func (s *logSink) Records(msg string) []logRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []logRecord
	for _, r := range s.records {
		if strings.Contains(r.Msg, msg) {
			out = append(out, r)
		}
	}
	return out
}

type sinkHandler struct {
	sink  *logSink
	attrs []slog.Attr
}

func (h *sinkHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *sinkHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{Level: r.Level, Msg: r.Message, Attrs: map[string]slog.Value{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.Resolve()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve()
		return true
	})
	h.sink.mu.Lock()
	defer h.sink.mu.Unlock()
	h.sink.records = append(h.sink.records, rec)
	return nil
}

func (h *sinkHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &sinkHandler{sink: h.sink, attrs: append(slices.Clip(h.attrs), attrs...)}
}

func (h *sinkHandler) WithGroup(string) slog.Handler { return h }
