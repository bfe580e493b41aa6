package kafkatransport_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// The tests here need no broker: kgo.NewClient never dials until the client is used.
// The tests that publish to an in-process cluster are in internal/tests.

func TestNewRefusesClientsThatCannotPublishDurably(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		opts []kgo.Opt
		cfg  kafkatransport.Config
		want string
	}{
		{"leader acks", []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()}, kafkatransport.Config{AllowNonIdempotent: true}, "acks"},
		{"no acks", []kgo.Opt{kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite()}, kafkatransport.Config{AllowNonIdempotent: true}, "acks"},
		{"not idempotent", []kgo.Opt{kgo.DisableIdempotentWrite()}, kafkatransport.Config{}, "AllowNonIdempotent"},
		{"transactional", []kgo.Opt{kgo.TransactionalID("relay")}, kafkatransport.Config{}, "transactional"},
		{"negative size", nil, kafkatransport.Config{MaxMessageSize: -1}, "Config.MaxMessageSize"},
		{"size beyond batches", nil, kafkatransport.Config{MaxMessageSize: 2 << 20}, "kgo.ProducerBatchMaxBytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cl, err := kgo.NewClient(tc.opts...) // never dials until used
			require.NoError(t, err)
			defer cl.Close()
			_, err = kafkatransport.New(cl, tc.cfg)
			require.ErrorIs(t, err, outbox.ErrMisconfigured)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := kafkatransport.New(nil, kafkatransport.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
}

func TestNewAcceptsOptIns(t *testing.T) {
	t.Parallel()
	cl, err := kgo.NewClient(kgo.DisableIdempotentWrite())
	require.NoError(t, err)
	defer cl.Close()
	_, err = kafkatransport.New(cl, kafkatransport.Config{AllowNonIdempotent: true})
	require.NoError(t, err)

	big, err := kgo.NewClient(kgo.ProducerBatchMaxBytes(4 << 20))
	require.NoError(t, err)
	defer big.Close()
	tr, err := kafkatransport.New(big, kafkatransport.Config{MaxMessageSize: 3 << 20})
	require.NoError(t, err)
	assert.Equal(t, 3<<20, tr.MaxMessageSize())
}

func TestMaxMessageSizeDefaultsToWhatTheClientCarries(t *testing.T) {
	t.Parallel()
	cl, err := kgo.NewClient()
	require.NoError(t, err)
	defer cl.Close()
	tr, err := kafkatransport.New(cl, kafkatransport.Config{})
	require.NoError(t, err)
	// kgo's default batch limit (1,000,012 bytes) is below Kafka's 1 MiB.
	assert.Equal(t, 1_000_012-512, tr.MaxMessageSize())

	big, err := kgo.NewClient(kgo.ProducerBatchMaxBytes(8 << 20))
	require.NoError(t, err)
	defer big.Close()
	tr, err = kafkatransport.New(big, kafkatransport.Config{})
	require.NoError(t, err)
	assert.Equal(t, kafkatransport.DefaultMaxMessageSize, tr.MaxMessageSize())

	var _ driver.SizeLimiter = tr
}

func TestAsReachesTheClient(t *testing.T) {
	t.Parallel()
	cl, err := kgo.NewClient()
	require.NoError(t, err)
	defer cl.Close()
	tr, err := kafkatransport.New(cl, kafkatransport.Config{})
	require.NoError(t, err)
	var got *kgo.Client
	require.True(t, tr.As(&got))
	assert.Same(t, cl, got)
	var wrong *string
	assert.False(t, tr.As(&wrong))
}

func TestDecodeRefusesForeignRecords(t *testing.T) {
	t.Parallel()
	_, err := kafkatransport.Decode(&kgo.Record{Topic: "t", Value: []byte("x")})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	_, err = kafkatransport.Decode(&kgo.Record{Topic: "t", Headers: []kgo.RecordHeader{{Key: outbox.HeaderMessageID, Value: []byte("nope")}}})
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	id := uuid.New()
	d, err := kafkatransport.Decode(&kgo.Record{Topic: "t", Partition: 2, Offset: 7, Headers: []kgo.RecordHeader{
		{Key: outbox.HeaderMessageID, Value: []byte(uuid.NewString())},
		{Key: outbox.HeaderMessageID, Value: []byte(id.String())}, // the last one wins
	}})
	require.NoError(t, err)
	assert.Equal(t, id, d.ID)
	assert.Equal(t, int32(2), *d.Partition)
	assert.Equal(t, int64(7), d.Offset)
}

// Config.Validate names the field; New applies it and also checks the limit against
// the client's batches.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, kafkatransport.Config{}.Validate())
	err := kafkatransport.Config{MaxMessageSize: -1}.Validate()
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "Config.MaxMessageSize")
	require.NoError(t, kafkatransport.Config{MaxMessageSize: 2 << 20}.Validate(), "the client decides whether it carries it")
}

// Close on a transport with nothing in flight returns at once, and again when called
// twice; Publish and Ping afterwards fail with ErrClosed and send nothing. The client
// stays the caller's: Close leaves it open.
func TestCloseEndsTheTransport(t *testing.T) {
	t.Parallel()
	cl, err := kgo.NewClient() // never dials: Publish after Close sends nothing
	require.NoError(t, err)
	defer cl.Close()
	tr, err := kafkatransport.New(cl, kafkatransport.Config{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing to wait for: a done context does not matter
	require.NoError(t, tr.Close(ctx))
	require.NoError(t, tr.Close(ctx), "closing twice")

	env, err := driver.NewEnvelope(outbox.Message{Topic: "t", Payload: []byte("p")}, driver.DefaultBucketCount)
	require.NoError(t, err)
	err = tr.Publish(context.Background(), []*driver.Envelope{env})
	require.ErrorIs(t, err, outbox.ErrClosed)
	assert.False(t, driver.IsPermanent(err))
	require.ErrorIs(t, tr.Publish(context.Background(), nil), outbox.ErrClosed)
	require.ErrorIs(t, tr.Ping(context.Background()), outbox.ErrClosed)
	assert.Empty(t, cl.BufferedProduceRecords(), "nothing reached the client")

	var got *kgo.Client
	require.True(t, tr.As(&got))
	assert.Same(t, cl, got, "the client is still the caller's")
}
