package main

import (
	"cmp"
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/internal/testenv"
)

// TestWalkthroughOnNATS runs the -nats path against the local server: the stories hold
// on a stream of the walkthrough's own, which is gone afterwards.
func TestWalkthroughOnNATS(t *testing.T) {
	t.Parallel()
	url := cmp.Or(os.Getenv("OUTBOX_TEST_NATS_URL"), "nats://127.0.0.1:4222")
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		testenv.Unavailable(t, "NATS with JetStream (OUTBOX_TEST_NATS_URL)", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	text := checkStory(t, options{NATS: url})
	m := regexp.MustCompile(`messages go to NATS JetStream stream (outbox-example-\w+)`).FindStringSubmatch(text)
	require.NotNil(t, m, text)

	// Only this run's stream: another walkthrough may share the server.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.Stream(ctx, m[1])
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound, "the walkthrough's stream %s is deleted", m[1])
}
