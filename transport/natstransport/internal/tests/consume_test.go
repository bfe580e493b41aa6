package tests

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/natstransport"
)

func TestSourceConfig(t *testing.T) {
	t.Parallel()
	_, js := connect(t, natsURL())
	s := createStream(t, js, jetstream.StreamConfig{Subjects: []string{streamName("cfg")}})
	none, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "none", AckPolicy: jetstream.AckNonePolicy})
	require.NoError(t, err)
	_, err = natstransport.NewSource(none, natstransport.SourceConfig{})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	assert.ErrorContains(t, err, "AckExplicitPolicy")
	explicit, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "explicit", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	_, err = natstransport.NewSource(explicit, natstransport.SourceConfig{FetchBatch: -1})
	assert.ErrorContains(t, err, "SourceConfig.FetchBatch")
	_, err = natstransport.NewSource(nil, natstransport.SourceConfig{})
	assert.ErrorIs(t, err, outbox.ErrMisconfigured)
	_, err = natstransport.NewSource(explicit, natstransport.SourceConfig{})
	assert.NoError(t, err)
}
