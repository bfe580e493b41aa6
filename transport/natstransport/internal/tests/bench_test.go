package tests

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest/relaysuite"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// rawPublish is the baseline: the raw JetStream client sending the same messages
// (Nats-Msg-Id, message-id, idempotency-key and key headers) through the
// transport's connection, as asynchronous publishes waited on once per batch.
func rawPublish(tb testing.TB, tr driver.Transport) func(context.Context, []*driver.Envelope) error {
	var js jetstream.JetStream
	require.True(tb, tr.(*natstransport.Transport).As(&js))
	return func(ctx context.Context, batch []*driver.Envelope) error {
		futures := make([]jetstream.PubAckFuture, len(batch))
		for i, env := range batch {
			id := env.ID.String()
			msg := &nats.Msg{Subject: env.Topic, Data: env.Payload, Header: nats.Header{
				jetstream.MsgIDHeader:       {id},
				outbox.HeaderMessageID:      {id},
				outbox.HeaderIdempotencyKey: {id},
				natstransport.HeaderKey:     {string(env.Key)},
			}}
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				return err
			}
			futures[i] = f
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
}

// BenchmarkPublish runs the relay suite's benchmark: the transport's Publish beside
// the raw client on one connection, to memory streams (so the server's disk does not
// hide the client's cost), and the relay draining a memory store through it.
func BenchmarkPublish(b *testing.B) {
	relaysuite.Benchmark(b, relayHarness(false))
}
