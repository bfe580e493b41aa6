package relay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// TestOwnRecordWrittenByAnotherLiveInstanceIsAClash: a sweep that finds its own
// relay record written by another instance counts and logs a clash only if that
// heartbeat is live and was written after the sweep started; a predecessor's record
// (older, stopped, lapsed) is no clash.
func TestOwnRecordWrittenByAnotherLiveInstanceIsAClash(t *testing.T) {
	t.Parallel()
	other := driver.Instance{Host: "elsewhere", PID: 7, Nonce: "feedfacefeedface"}
	for _, tc := range []struct {
		name    string
		seen    time.Duration // the other instance's heartbeat, from the sweep's start
		stopped bool
		clash   bool
	}{
		{name: "live, after the start", seen: time.Second, clash: true},
		{name: "before the start (a predecessor)", seen: -time.Second},
		{name: "stopped", seen: time.Second, stopped: true},
		{name: "lapsed", seen: -time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := newClock()
			store := newStore(t, 2)
			ok, err := store.Driver().Heartbeat(ctx, "r", c.Now().Add(tc.seen), 2, other)
			require.NoError(t, err)
			require.True(t, ok)
			if tc.stopped {
				require.NoError(t, store.Driver().StopRelay(ctx, "r", c.Now().Add(tc.seen)))
			}
			sink := &logSink{}
			cfg := testConfig(c, "r")
			cfg.Logger = sink.Logger()
			d := newDispatcher(t, store, outboxtest.NewRecorder(), cfg)
			require.NotEqual(t, other, d.Instance())
			_, err = d.RunOnce(ctx)
			require.NoError(t, err)
			logged := sink.Records("another live process runs under this relay's ID")
			if !tc.clash {
				require.Zero(t, d.Stats().InstanceClashes)
				require.Empty(t, logged)
				return
			}
			require.Equal(t, int64(1), d.Stats().InstanceClashes, "the heartbeat counts once, however often it is read")
			require.Len(t, logged, 1)
			require.Equal(t, "ERROR", logged[0].Level.String())
			require.Equal(t, other.String(), logged[0].Attrs["other_instance"].String())
			require.Equal(t, d.Instance().String(), logged[0].Attrs["this_instance"].String())
			require.Equal(t, "r", logged[0].Attrs["relay"].String())
		})
	}
}
