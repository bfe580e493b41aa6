package sqlstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
)

func TestRoundTrip(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ctx := testContext(t)
		s := b.open(t, sqlstoreConfig())
		p := int32(5)
		env, err := outbox.NewEnvelope(outbox.Message{
			Topic: "t", Key: []byte{}, Payload: nil, Partition: &p,
			Headers: []outbox.Header{{Key: "a", Value: nil}, {Key: "b", Value: []byte{}}, {Key: "a", Value: []byte("x")}},
		}, s.BucketCount())
		require.NoError(t, err)
		env2 := newEnvelope(t, s, "k", "v")
		require.NoError(t, s.Enqueue(ctx, env, env2))
		require.NotZero(t, env.Seq)
		require.Greater(t, env2.Seq, env.Seq)
		got, err := s.Find(ctx, env.ID)
		require.NoError(t, err)
		require.Equal(t, env.ID, got.ID)
		require.Equal(t, env.Seq, got.Seq)
		require.NotNil(t, got.Key)
		require.Empty(t, got.Key)
		require.Nil(t, got.Payload)
		require.Equal(t, env.Headers, got.Headers)
		require.Equal(t, p, *got.Partition)
		require.True(t, env.CreatedAt.Truncate(1000).Equal(got.CreatedAt), "%v != %v", env.CreatedAt, got.CreatedAt)
		got2, err := s.Find(ctx, env2.ID)
		require.NoError(t, err)
		require.Equal(t, []byte("k"), got2.Key)
		require.Equal(t, []byte("v"), got2.Payload)
		require.Nil(t, got2.Headers)
		require.Nil(t, got2.Partition)
	})
}
