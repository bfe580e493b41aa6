package driver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

func newEnvelope(t *testing.T, topic string) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: topic, Key: []byte("k")}, 8)
	require.NoError(t, err)
	return env
}

func TestNewEnvelope(t *testing.T) {
	t.Parallel()
	p := int32(3)
	msg := outbox.Message{Topic: "orders", Key: []byte{}, Partition: &p, Headers: []outbox.Header{{Key: "h", Value: nil}}}
	env, err := driver.NewEnvelope(msg, 8)
	require.NoError(t, err)
	require.EqualValues(t, 7, env.ID.Version())
	require.Equal(t, 3, env.Bucket)
	require.Equal(t, 8, env.BucketCount)
	require.Equal(t, driver.Pending, env.Status)
	require.True(t, env.Due(time.Now()))

	_, err = driver.NewEnvelope(outbox.Message{}, 8)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	neg := int32(-1)
	_, err = driver.NewEnvelope(outbox.Message{Topic: "t", Partition: &neg}, 8)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = driver.NewEnvelope(outbox.Message{Topic: "t", Headers: []outbox.Header{{}}}, 8)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = driver.NewEnvelope(outbox.Message{Topic: "t"}, 0)
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	for _, bad := range []string{"a\x00b", "\xff\xfe"} {
		_, err = driver.NewEnvelope(outbox.Message{Topic: bad}, 8)
		require.ErrorIs(t, err, outbox.ErrInvalidMessage, "topic %q", bad)
		_, err = driver.NewEnvelope(outbox.Message{Topic: "t", Headers: []outbox.Header{{Key: bad}}}, 8)
		require.ErrorIs(t, err, outbox.ErrInvalidMessage, "header key %q", bad)
	}
	require.ErrorIs(t, outbox.ErrTooLarge, outbox.ErrInvalidMessage, "a message too large is an invalid message")
	require.NotErrorIs(t, outbox.ErrInvalidMessage, outbox.ErrTooLarge)
}

func TestEnvelopeCloneIsDeep(t *testing.T) {
	t.Parallel()
	p := int32(1)
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: []byte("k"), Payload: []byte("v"),
		Headers: []outbox.Header{{Key: "a", Value: []byte("1")}}, Partition: &p}, 4)
	require.NoError(t, err)
	c := env.Clone()
	require.Equal(t, env, c)
	c.Key[0], c.Payload[0], c.Headers[0].Value[0], *c.Partition = 'x', 'x', 'x', 9
	require.Equal(t, "k", string(env.Key))
	require.Equal(t, "v", string(env.Payload))
	require.Equal(t, "1", string(env.Headers[0].Value))
	require.EqualValues(t, 1, *env.Partition)

	tomb := &driver.Envelope{Message: outbox.Message{Key: []byte{}}}
	require.NotNil(t, tomb.Clone().Key, "empty key stays empty, not nil")
	require.Nil(t, tomb.Clone().Payload, "tombstone stays nil")
}

func TestPublishErrorAndPermanent(t *testing.T) {
	t.Parallel()
	cause := errors.New("record too large")
	a, b := newEnvelope(t, "a"), newEnvelope(t, "b")
	err := error(&driver.PublishError{Failed: []driver.MessageError{
		{ID: a.ID, Err: driver.Permanent(cause)},
		{ID: b.ID, Err: context.DeadlineExceeded},
	}})
	require.ErrorIs(t, err, cause)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, driver.IsPermanent(err), "some failure is permanent")
	require.False(t, driver.IsPermanent(context.DeadlineExceeded))
	require.True(t, driver.IsPermanent(fmt.Errorf("wrapped: %w", driver.Permanent(cause))))
	require.NoError(t, driver.Permanent(nil))
	require.Contains(t, err.Error(), "2 messages failed")
}

func TestHubNotifiesAndCloses(t *testing.T) {
	t.Parallel()
	var hub driver.Hub
	ctx, cancel := context.WithCancel(context.Background())
	ch := hub.Subscribe(ctx)
	hub.Notify(3, 5)
	require.Equal(t, 3, <-ch)
	require.Equal(t, 5, <-ch)

	for range 1000 { // a slow subscriber never blocks the writer
		hub.Notify(1)
	}
	cancel()
	require.Eventually(t, func() bool {
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return true
				}
			default:
				return false
			}
		}
	}, time.Second, time.Millisecond, "subscription closes with its context")

	other := hub.Subscribe(context.Background())
	hub.Close()
	_, ok := <-other
	require.False(t, ok, "close ends subscriptions")
	_, ok = <-hub.Subscribe(context.Background())
	require.False(t, ok, "subscribing to a closed hub gets a closed channel")
}
