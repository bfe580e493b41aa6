package fleet

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
)

// clashMessage starts the ERROR a relay logs when another live process runs under
// its ID.
const clashMessage = "relay: another live process runs under this relay's ID"

// errorLog keeps the ERROR records of one relay, as text.
type errorLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *errorLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *errorLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *errorLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelError}))
}

// sharedID runs two relays under one ID on one store, as two processes started with
// the same configuration would: each sees the other's heartbeats in its own record,
// counts them and logs an ERROR naming both instances.
func (f fleetSuite) sharedID(t *testing.T) {
	s := f.store(t, 8)
	var logs [2]errorLog
	var relays [2]*relay.Relay
	for i := range relays {
		cfg := quick("shared")
		cfg.Logger = logs[i].logger()
		relays[i] = f.relay(t, s, outboxtest.NewRecorder(), cfg)
	}
	a, b := relays[0], relays[1]
	require.NotEqual(t, a.Instance(), b.Instance(), "every relay is an instance of its own")
	waitFor(t, "both relays count the clash", func() bool {
		return a.Stats().InstanceClashes > 0 && b.Stats().InstanceClashes > 0
	})
	waitFor(t, "both relays log it", func() bool {
		return strings.Contains(logs[0].String(), clashMessage) && strings.Contains(logs[1].String(), clashMessage)
	})
	for i, d := range relays {
		other := relays[1-i]
		line := logs[i].String()
		require.Contains(t, line, "level=ERROR")
		require.Contains(t, line, d.Instance().String(), "the ERROR names this instance")
		require.Contains(t, line, other.Instance().String(), "the ERROR names the other instance")
		require.Contains(t, line, "give each process its own relay ID", "the ERROR names the fix")
	}
	t.Logf("clashes counted: %d and %d", a.Stats().InstanceClashes, b.Stats().InstanceClashes)
}

// restart stops a relay and starts another under its ID, then kills that one and
// starts a third at once, within the dead one's lease: a relay taking over its own
// ID's record from a predecessor is no clash.
func (f fleetSuite) restart(t *testing.T) {
	s := f.store(t, 8)
	var logs [3]errorLog
	start := func(i int) *relay.Relay {
		cfg := quick("solo")
		cfg.Logger = logs[i].logger()
		return f.relay(t, s, outboxtest.NewRecorder(), cfg)
	}
	first := start(0)
	waitFor(t, "the first relay holds every bucket", func() bool { return len(first.Owned()) == 8 })
	require.NoError(t, first.Stop(context.Background()))

	second := start(1)
	waitFor(t, "the relay restarted after a stop holds every bucket", func() bool { return len(second.Owned()) == 8 })
	rounds := second.Stats().Rounds
	waitFor(t, "three more rounds", func() bool { return second.Stats().Rounds >= rounds+3 })
	second.Kill()

	third := start(2)
	waitFor(t, "the relay restarted after a crash holds every bucket", func() bool { return len(third.Owned()) == 8 })
	rounds = third.Stats().Rounds
	waitFor(t, "three more rounds", func() bool { return third.Stats().Rounds >= rounds+3 })

	for i, d := range []*relay.Relay{first, second, third} {
		require.Zero(t, d.Stats().InstanceClashes, "relay %d: a restart under its own ID is no clash", i)
		require.NotContains(t, logs[i].String(), clashMessage, "relay %d", i)
	}
}
