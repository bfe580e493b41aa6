package outboxtest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
)

// recorderHarness runs the transport suite against a Recorder: each test gets its own,
// and Read consumes what it recorded, topic by topic.
func recorderHarness(wrap func(t *testing.T, r *outboxtest.Recorder) driver.Transport) outboxtest.TransportHarness {
	const maxSize = 64 << 10
	var mu sync.Mutex
	recorders := map[*testing.T]*outboxtest.Recorder{}
	offsets := map[*testing.T]map[string]int{}
	return outboxtest.TransportHarness{
		New: func(t *testing.T, topics ...string) driver.Transport {
			r := outboxtest.NewRecorder()
			// Give the Recorder a broker's size limit, so the per-message failure
			// subtest runs.
			r.FailWhen(func(env *driver.Envelope) error {
				if env.Size() > maxSize {
					return driver.Permanent(fmt.Errorf("%w: %d bytes", outbox.ErrTooLarge, env.Size()))
				}
				return nil
			})
			mu.Lock()
			recorders[t] = r
			offsets[t] = map[string]int{}
			mu.Unlock()
			t.Cleanup(func() {
				mu.Lock()
				delete(recorders, t)
				delete(offsets, t)
				mu.Unlock()
			})
			return wrap(t, r)
		},
		Read: func(t *testing.T, topic string, n int) []outboxtest.Received {
			mu.Lock()
			r, off := recorders[t], offsets[t]
			mu.Unlock()
			require.NotNil(t, r, "Read before New")
			deadline := time.Now().Add(5 * time.Second)
			for {
				got := r.Received(topic)
				if len(got) >= off[topic]+n {
					out := got[off[topic] : off[topic]+n]
					off[topic] += n
					return out
				}
				require.True(t, time.Now().Before(deadline), "%d messages on %s, want %d more", len(got)-off[topic], topic, n)
				time.Sleep(5 * time.Millisecond)
			}
		},
		MaxMessageSize: maxSize,
		Ordered:        true,
	}
}

func TestRecorderPassesTheTransportSuite(t *testing.T) {
	outboxtest.RunTransportTests(t, recorderHarness(func(_ *testing.T, r *outboxtest.Recorder) driver.Transport { return r }))
}

func TestFaultTransportWithoutFaultsPassesTheTransportSuite(t *testing.T) {
	outboxtest.RunTransportTests(t, recorderHarness(func(t *testing.T, r *outboxtest.Recorder) driver.Transport {
		ft, err := outboxtest.NewFaultTransport(r, outboxtest.Faults{})
		require.NoError(t, err)
		return ft
	}))
}

func TestRecorderReceivedStampsMessageID(t *testing.T) {
	t.Parallel()
	r := outboxtest.NewRecorder()
	env := envelope(t, "k", "p")
	env.Headers = []outbox.Header{{Key: "a", Value: []byte("1")}}
	require.NoError(t, r.Publish(context.Background(), []*driver.Envelope{env}))
	got := r.Received("")
	require.Len(t, got, 1)
	require.Equal(t, env.ID.String(), got[0].ID)
	require.Equal(t, []outbox.Header{{Key: "a", Value: []byte("1")}, {Key: outbox.HeaderMessageID, Value: []byte(env.ID.String())}}, got[0].Headers)
	require.Len(t, r.Messages()[0].Headers, 1, "reading does not change the record")
	require.Empty(t, r.Received("other-topic"))
}
