package transportkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

func envelope(t *testing.T, key []byte, payload []byte) *driver.Envelope {
	t.Helper()
	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Key: key, Payload: payload}, 1)
	require.NoError(t, err)
	return env
}

func TestPublishSkipsEmptyBatchesAndEndedContexts(t *testing.T) {
	called := false
	send := func(context.Context, []*driver.Envelope, []error) error {
		called = true
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.NoError(t, Publish(ctx, nil, send), "an empty batch publishes nothing, whatever ctx")
	err := Publish(ctx, []*driver.Envelope{envelope(t, nil, []byte("p"))}, send)
	assert.Same(t, context.Canceled, err, "ctx's own error, unwrapped")
	assert.False(t, called, "send is not called")
}

func TestPublishNamesTheFailedEnvelopesInBatchOrder(t *testing.T) {
	batch := []*driver.Envelope{envelope(t, nil, []byte("a")), envelope(t, nil, []byte("b")), envelope(t, nil, []byte("c"))}
	refused := driver.Permanent(errors.New("refused"))
	lost := errors.New("lost")
	err := Publish(context.Background(), batch, func(_ context.Context, got []*driver.Envelope, errs []error) error {
		require.Len(t, errs, len(got))
		errs[2], errs[0] = lost, refused
		return nil
	})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 2)
	assert.Equal(t, batch[0].ID, pe.Failed[0].ID)
	assert.Equal(t, refused, pe.Failed[0].Err)
	assert.Equal(t, batch[2].ID, pe.Failed[1].ID)
	assert.Equal(t, lost, pe.Failed[1].Err)

	err = Publish(context.Background(), batch, func(context.Context, []*driver.Envelope, []error) error { return nil })
	assert.NoError(t, err, "nil, not a typed nil, when nothing failed")
	assert.True(t, err == nil)

	down := errors.New("broker unreachable")
	err = Publish(context.Background(), batch, func(_ context.Context, _ []*driver.Envelope, errs []error) error {
		errs[1] = lost
		return down
	})
	assert.Same(t, down, err, "send's error wins: nothing may be assumed sent")
}

func TestHoldBackTails(t *testing.T) {
	batch := []*driver.Envelope{
		envelope(t, []byte("a"), []byte("1")), envelope(t, nil, []byte("2")), envelope(t, []byte("a"), []byte("3")),
		envelope(t, nil, []byte("4")), envelope(t, []byte("b"), []byte("5")), envelope(t, []byte("b"), []byte("6")),
		envelope(t, []byte{}, []byte("7")), envelope(t, []byte{}, []byte("8")),
	}
	heldBack := errors.New("held back")
	lost := errors.New("lost")
	errs := []error{lost, lost, nil, nil, nil, nil, lost, nil}
	HoldBackTails(batch, errs, heldBack)
	assert.Equal(t, []error{lost, lost, heldBack, nil, nil, nil, lost, heldBack}, errs,
		"a key's messages after its first failure are held back; keyless ones and other keys are not; an empty key is a key")
}

func TestCheckSize(t *testing.T) {
	env := envelope(t, nil, bytes.Repeat([]byte{'x'}, 100))
	size := env.Size()
	assert.NoError(t, CheckSize("sometransport", env, size))
	assert.NoError(t, CheckSize("sometransport", env, 0), "0 is no limit")
	err := CheckSize("sometransport", env, size-1)
	assert.True(t, driver.IsPermanent(err))
	assert.ErrorIs(t, err, outbox.ErrTooLarge)
	assert.EqualError(t, err, fmt.Sprintf("%v: sometransport: message of %d bytes exceeds the transport's limit of %d (Config.MaxMessageSize)", outbox.ErrTooLarge, size, size-1))
}

type config struct{ err error }

func (c config) Validate() error { return c.err }

func TestCheckArgs(t *testing.T) {
	invalid := errors.New("invalid")
	assert.NoError(t, CheckArgs(false, "x: client is nil", config{}))
	assert.Same(t, invalid, CheckArgs(false, "x: client is nil", config{invalid}))
	err := CheckArgs(true, "x: client is nil: pass one", config{invalid})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured, "a missing argument is reported before the config")
	assert.EqualError(t, err, outbox.ErrMisconfigured.Error()+": x: client is nil: pass one")
}

func TestPositive(t *testing.T) {
	assert.NoError(t, Positive("x", "Config.N", 0, "the default"))
	assert.NoError(t, Positive("x", "Config.N", 3, "the default"))
	err := Positive("x", "Config.N", -1, "no limit")
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.EqualError(t, err, outbox.ErrMisconfigured.Error()+": x: Config.N is -1; it must be positive (or 0 for no limit)")
	assert.EqualError(t, Positive("x", "Config.Wait", -time.Second, "the default"),
		outbox.ErrMisconfigured.Error()+": x: Config.Wait is -1s; it must be positive (or 0 for the default)")
	assert.EqualError(t, Positive("x", "Config.Len", int64(-2), "none"),
		outbox.ErrMisconfigured.Error()+": x: Config.Len is -2; it must be positive (or 0 for none)")
}

func TestRequired(t *testing.T) {
	assert.NoError(t, Required("x", "SourceConfig.Queue", "q", ""))
	err := Required("x", "SourceConfig.Queue", "", "")
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.EqualError(t, err, outbox.ErrMisconfigured.Error()+": x: SourceConfig.Queue is required")
	assert.EqualError(t, Required("x", "SourceConfig.Name", "", "a stable name per process"),
		outbox.ErrMisconfigured.Error()+": x: SourceConfig.Name is required (a stable name per process)")
}

func TestBetween(t *testing.T) {
	for _, v := range []int{0, 7, 10} {
		assert.NoError(t, Between("x", "Config.N", v, 0, 10, "the broker takes 0 to 10"), "%d", v)
	}
	for _, v := range []int{-1, 11} {
		err := Between("x", "Config.N", v, 0, 10, "the broker takes 0 to 10")
		assert.ErrorIs(t, err, outbox.ErrMisconfigured)
		assert.EqualError(t, err, fmt.Sprintf("%s: x: Config.N is %d; the broker takes 0 to 10", outbox.ErrMisconfigured, v))
	}
	assert.EqualError(t, Between("x", "Config.Wait", 21*time.Second, 0, 20*time.Second, "at most 20 s"),
		outbox.ErrMisconfigured.Error()+": x: Config.Wait is 21s; at most 20 s")
}

func TestMessageID(t *testing.T) {
	id := uuid.New()
	m := &outbox.Message{Headers: []outbox.Header{
		{Key: outbox.HeaderMessageID, Value: []byte("stale")},
		{Key: outbox.HeaderMessageID, Value: []byte(id.String())},
	}}
	got, err := MessageID(m)
	require.NoError(t, err)
	assert.Equal(t, id, got, "the last header counts")

	_, err = MessageID(&outbox.Message{Headers: []outbox.Header{{Key: "other", Value: []byte(id.String())}}})
	assert.EqualError(t, err, "no "+outbox.HeaderMessageID+" header: it did not come through the outbox")
	_, err = MessageID(&outbox.Message{Headers: []outbox.Header{{Key: outbox.HeaderMessageID, Value: []byte("nope")}}})
	assert.ErrorContains(t, err, outbox.HeaderMessageID+` header "nope": `)
}

func TestPayload(t *testing.T) {
	assert.Nil(t, Payload([]byte("p"), true), "a tombstone")
	assert.Nil(t, Payload(nil, true))
	empty := Payload(nil, false)
	assert.NotNil(t, empty, "an empty payload is not a tombstone")
	assert.Empty(t, empty)
	body := []byte("p")
	assert.Equal(t, body, Payload(body, false))
}

func TestDelivery(t *testing.T) {
	env := envelope(t, []byte("k"), []byte("p"))
	raw := struct{ n int }{7}
	d := Delivery(raw, env.ID, env.Message, true, nil)
	assert.Equal(t, env.ID, d.ID)
	assert.Equal(t, env.Message, d.Message)
	assert.True(t, d.Redelivered)
	assert.Equal(t, raw, d.Raw)
	assert.Zero(t, d.Attempt, "the consumer counts attempts")

	bad := Delivery(raw, env.ID, env.Message, true, errors.New("undecodable"))
	assert.Equal(t, raw, bad.Raw)
	assert.Zero(t, bad.ID, "nothing decoded is passed on")
	assert.Empty(t, bad.Payload)
}

func TestOtherNames(t *testing.T) {
	m := map[string][]string{"b": nil, "x-own": nil, "a": nil, "c": nil}
	own := func(name string) bool { return name == "x-own" }
	assert.Equal(t, []string{"a", "b", "c"}, OtherNames(m, own))
	assert.Empty(t, OtherNames(map[string]int{"x-own": 1}, own))
}
