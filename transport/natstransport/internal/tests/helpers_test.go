package tests

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// natsURL is where the server is (OUTBOX_TEST_NATS_URL).
func natsURL() string { return testenv.NATSURL() }

// unavailable fails the test under CI=true, where the server must be there, and
// skips it otherwise.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	testenv.Missing(tb, "NATS with JetStream (nats-server -js) at "+natsURL(), "OUTBOX_TEST_NATS_URL", err)
}

// connect opens a connection to url (the server's, or a proxy's) and a JetStream
// context on it, both closed at cleanup.
func connect(tb testing.TB, url string, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	opts = append([]nats.Option{nats.Timeout(2 * time.Second), nats.Name("outbox-test")}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		unavailable(tb, err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		unavailable(tb, err)
	}
	return nc, js
}

// streamName is a stream name of the test's own.
func streamName(prefix string) string {
	return prefix + "-" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
}

// createStream creates a memory stream capturing subjects, deleted at cleanup.
func createStream(tb testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	tb.Helper()
	if cfg.Name == "" {
		cfg.Name = streamName("outbox")
	}
	if cfg.Storage == 0 {
		cfg.Storage = jetstream.MemoryStorage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, cfg)
	require.NoError(tb, err, "create stream %s", cfg.Name)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, cfg.Name)
	})
	return s
}

func newTransport(tb testing.TB, js jetstream.JetStream, cfg natstransport.Config) *natstransport.Transport {
	tb.Helper()
	tr, err := natstransport.New(js, cfg)
	require.NoError(tb, err)
	return tr
}

func envelope(tb testing.TB, m outbox.Message) *driver.Envelope {
	tb.Helper()
	env, err := driver.NewEnvelope(m, driver.DefaultBucketCount)
	require.NoError(tb, err)
	return env
}

// reader reads one subject of a stream from the start, in stream order.
type reader struct {
	cons jetstream.Consumer
}

func newReader(tb testing.TB, s jetstream.Stream, subject string) *reader {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Not an ordered consumer: the server deletes those after a few seconds without
	// a fetch, as during an outage a test stages.
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{
		FilterSubject:     subject,
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: 10 * time.Minute,
	})
	require.NoError(tb, err)
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.DeleteConsumer(ctx, c.CachedInfo().Name)
	})
	return &reader{cons: c}
}

// some returns up to n messages, decoded, waiting at most a second for them.
func (r *reader) some(tb testing.TB, n int) []natstransport.Delivery {
	tb.Helper()
	var out []natstransport.Delivery
	batch, err := r.cons.Fetch(n, jetstream.FetchMaxWait(time.Second))
	require.NoError(tb, err)
	for m := range batch.Messages() {
		d, err := natstransport.Decode(m)
		require.NoError(tb, err)
		out = append(out, d)
	}
	if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		require.NoError(tb, err)
	}
	return out
}

// read returns the next n messages, decoded, failing after a generous wait.
func (r *reader) read(tb testing.TB, n int) []natstransport.Delivery {
	tb.Helper()
	out := make([]natstransport.Delivery, 0, n)
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < n {
		require.True(tb, time.Now().Before(deadline), "only %d of %d messages arrived", len(out), n)
		out = append(out, r.some(tb, n-len(out))...)
	}
	return out
}

// count returns how many messages the stream holds.
func count(tb testing.TB, s jetstream.Stream) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := s.Info(ctx)
	require.NoError(tb, err)
	return info.State.Msgs
}

// hostPort is the host:port of a nats:// URL.
func hostPort(url string) string {
	s := strings.TrimPrefix(url, "nats://")
	if i := strings.LastIndex(s, "@"); i >= 0 {
		s = s[i+1:]
	}
	return s
}
