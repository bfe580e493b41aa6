package tests

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/testenv"
	"github.com/outboxkit/outbox/transport/redistransport"
)

// redisAddr is where the server is (OUTBOX_TEST_REDIS_ADDR).
func redisAddr() string { return testenv.RedisAddr() }

// unavailable fails the test under CI=true, where the server must be there, and
// skips it otherwise.
func unavailable(tb testing.TB, err error) {
	tb.Helper()
	testenv.Missing(tb, "Redis at "+redisAddr(), "OUTBOX_TEST_REDIS_ADDR", err)
}

// connect returns a client of addr (the server's, or a proxy's), closed at cleanup.
func connect(tb testing.TB, addr string, tune ...func(*redis.Options)) *redis.Client {
	tb.Helper()
	opts := &redis.Options{Addr: addr, DialTimeout: 2 * time.Second, MaxRetries: -1}
	for _, f := range tune {
		f(opts)
	}
	client := redis.NewClient(opts)
	tb.Cleanup(func() { _ = client.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		unavailable(tb, err)
	}
	return client
}

// streamKey is a stream key of the test's own, deleted at cleanup.
func streamKey(tb testing.TB, client *redis.Client, prefix string) string {
	tb.Helper()
	key := "outbox-test-" + prefix + "-" + uuid.NewString()[:8]
	tb.Cleanup(func() { deleteKeys(client, key) })
	return key
}

func deleteKeys(client *redis.Client, keys ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = client.Del(ctx, keys...).Err()
}

func newTransport(tb testing.TB, client redis.UniversalClient, cfg redistransport.Config) *redistransport.Transport {
	tb.Helper()
	tr, err := redistransport.New(client, cfg)
	require.NoError(tb, err)
	return tr
}

func envelope(tb testing.TB, m outbox.Message) *driver.Envelope {
	tb.Helper()
	env, err := driver.NewEnvelope(m, driver.DefaultBucketCount)
	require.NoError(tb, err)
	return env
}

// reader reads one stream from the start, in stream order.
type reader struct {
	client *redis.Client
	stream string
	last   string
}

func newReader(client *redis.Client, stream string) *reader {
	return &reader{client: client, stream: stream, last: "0"}
}

// some returns up to n entries after the last one read, decoded, waiting at most a
// second for the first.
func (r *reader) some(tb testing.TB, n int) []redistransport.Delivery {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := r.client.XRead(ctx, &redis.XReadArgs{Streams: []string{r.stream, r.last}, Count: int64(n), Block: time.Second}).Result()
	if err == redis.Nil {
		return nil
	}
	require.NoError(tb, err)
	var out []redistransport.Delivery
	for _, s := range res {
		for _, m := range s.Messages {
			d, err := redistransport.Decode(s.Stream, m)
			require.NoError(tb, err)
			out = append(out, d)
			r.last = m.ID
		}
	}
	return out
}

// read returns the next n entries, failing after a generous wait.
func (r *reader) read(tb testing.TB, n int) []redistransport.Delivery {
	tb.Helper()
	out := make([]redistransport.Delivery, 0, n)
	deadline := time.Now().Add(30 * time.Second)
	for len(out) < n {
		require.True(tb, time.Now().Before(deadline), "only %d of %d entries arrived", len(out), n)
		out = append(out, r.some(tb, n-len(out))...)
	}
	return out
}

// length is the stream's length.
func length(tb testing.TB, client *redis.Client, stream string) int64 {
	tb.Helper()
	n, err := client.XLen(context.Background(), stream).Result()
	require.NoError(tb, err)
	return n
}
