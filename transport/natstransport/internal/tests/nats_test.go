package tests

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// A subject no stream captures fails permanently, saying so; the rest of the batch,
// on a subject a stream captures, is delivered.
func TestNoStreamIsPermanent(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	subject := streamName("captured")
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{subject}})
	tr := newTransport(t, js, natstransport.Config{})
	lost := envelope(t, outbox.Message{Topic: streamName("nowhere"), Key: []byte("k"), Payload: []byte("x")})
	kept := envelope(t, outbox.Message{Topic: subject, Key: []byte("k"), Payload: []byte("y")})

	failed := outboxtest.Failures(t, tr.Publish(t.Context(), []*driver.Envelope{lost, kept}))
	require.Len(t, failed, 1)
	err := failed[lost.ID]
	assert.True(t, driver.IsPermanent(err), "no stream is permanent: %v", err)
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.ErrorContains(t, err, "no stream captures subject")
	got := newReader(t, s, subject).read(t, 1)
	assert.Equal(t, kept.ID, got[0].ID)
}

// The stream's max_msg_size refuses a message permanently, as too large; the others
// are stored.
func TestStreamMaxMsgSizeIsPermanent(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	subject := streamName("small")
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{subject}, MaxMsgSize: 1024})
	tr := newTransport(t, js, natstransport.Config{})
	small := envelope(t, outbox.Message{Topic: subject, Key: []byte("a"), Payload: []byte("small")})
	big := envelope(t, outbox.Message{Topic: subject, Key: []byte("b"), Payload: make([]byte, 4096)})

	failed := outboxtest.Failures(t, tr.Publish(t.Context(), []*driver.Envelope{small, big}))
	require.Len(t, failed, 1)
	assert.True(t, driver.IsPermanent(failed[big.ID]), "%v", failed[big.ID])
	assert.ErrorIs(t, failed[big.ID], outbox.ErrTooLarge)
	assert.Equal(t, uint64(1), count(t, s))
}

// A full stream that discards new messages refuses transiently: space may free up.
func TestFullStreamIsTransient(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	subject := streamName("full")
	createStream(t, js, jetstream.StreamConfig{Subjects: []string{subject}, MaxMsgs: 1, Discard: jetstream.DiscardNew})
	tr := newTransport(t, js, natstransport.Config{})
	first := envelope(t, outbox.Message{Topic: subject, Payload: []byte("1")})
	second := envelope(t, outbox.Message{Topic: subject, Payload: []byte("2")})

	failed := outboxtest.Failures(t, tr.Publish(t.Context(), []*driver.Envelope{first, second}))
	require.Len(t, failed, 1)
	require.Contains(t, failed, second.ID)
	assert.False(t, driver.IsPermanent(failed[second.ID]), "%v", failed[second.ID])
}

// A topic mapped to a subject that cannot be published to fails permanently.
func TestInvalidSubjectIsPermanent(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	tr := newTransport(t, js, natstransport.Config{Subject: func(topic string) string { return "events." + topic }})
	env := envelope(t, outbox.Message{Topic: "has space", Payload: []byte("x")})
	failed := outboxtest.Failures(t, tr.Publish(t.Context(), []*driver.Envelope{env}))
	assert.True(t, driver.IsPermanent(failed[env.ID]))
	assert.ErrorIs(t, failed[env.ID], outbox.ErrInvalidMessage)
}

// Publishing the same envelope twice stores it once: Nats-Msg-Id and the stream's
// duplicate window drop the copy, and the copy still counts as acknowledged.
func TestRepublishIsDroppedByTheDuplicateWindow(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	subject := streamName("dedup")
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{subject}, Duplicates: time.Minute})
	tr := newTransport(t, js, natstransport.Config{})
	env := envelope(t, outbox.Message{Topic: subject, Key: []byte("k"), Payload: []byte("once")})
	require.NoError(t, tr.Publish(t.Context(), []*driver.Envelope{env}))
	require.NoError(t, tr.Publish(t.Context(), []*driver.Envelope{env}), "a duplicate is acknowledged")
	assert.Equal(t, uint64(1), count(t, s))
}

// A subject mapping publishes on the mapped subject; Decode returns the topic.
func TestSubjectMapping(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	prefix := streamName("events")
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{prefix + ".>"}})
	tr := newTransport(t, js, natstransport.Config{Subject: func(topic string) string { return prefix + "." + topic }})
	env := envelope(t, outbox.Message{Topic: "order-placed", Key: []byte("order-7"), Payload: []byte("p")})
	require.NoError(t, tr.Publish(t.Context(), []*driver.Envelope{env}))
	d := newReader(t, s, prefix+".order-placed").read(t, 1)[0]
	assert.Equal(t, "order-placed", d.Topic)
	assert.Equal(t, prefix+".order-placed", d.Subject)
	assert.Equal(t, env.ID, d.ID)
	assert.Equal(t, s.CachedInfo().Config.Name, d.Stream)
	assert.Equal(t, uint64(1), d.Sequence)
	assert.False(t, d.Timestamp.IsZero())
}

// New takes its limit from the server and refuses a larger one.
func TestNewChecksMaxMessageSizeAgainstMaxPayload(t *testing.T) {
	t.Parallel()
	nc, js := connect(t, natsURL())
	tr := newTransport(t, js, natstransport.Config{})
	assert.Equal(t, int(nc.MaxPayload())-512, tr.MaxMessageSize())
	_, err := natstransport.New(js, natstransport.Config{MaxMessageSize: int(nc.MaxPayload())})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.ErrorContains(t, err, "max_payload")

	var got jetstream.JetStream
	require.True(t, tr.As(&got))
	var conn *nats.Conn
	require.True(t, tr.As(&conn))
	assert.Same(t, nc, conn)
}
