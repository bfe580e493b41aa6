package main

import (
	"cmp"
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/internal/testenv"
)

// TestWalkthroughOnRedis runs the -redis path against the local server: the stories
// hold on a stream of the walkthrough's own, which is gone afterwards.
func TestWalkthroughOnRedis(t *testing.T) {
	t.Parallel()
	addr := cmp.Or(os.Getenv("OUTBOX_TEST_REDIS_ADDR"), "127.0.0.1:6379")
	client := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = client.Close() })
	if err := client.Ping(t.Context()).Err(); err != nil {
		testenv.Unavailable(t, "Redis (OUTBOX_TEST_REDIS_ADDR)", err)
	}

	text := checkStory(t, options{Redis: addr})
	m := regexp.MustCompile(`messages go to Redis stream (outbox-example-\S+) at `).FindStringSubmatch(text)
	require.NotNil(t, m, text)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := client.Exists(ctx, m[1]).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the walkthrough's stream %s is deleted", m[1])
}
