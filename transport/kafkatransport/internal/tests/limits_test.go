package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// setTopicConfig sets one config of a topic through the admin API, as an operator
// would, and checks the cluster reports it back.
func setTopicConfig(t *testing.T, c *kfake.Cluster, topic, name, value string) {
	t.Helper()
	adm := kadm.NewClient(newClient(t, c))
	resps, err := adm.AlterTopicConfigs(context.Background(), []kadm.AlterConfig{{Op: kadm.SetConfig, Name: name, Value: kadm.StringPtr(value)}}, topic)
	require.NoError(t, err)
	for _, r := range resps {
		require.NoError(t, r.Err, "alter %s of %s: %s", name, r.Name, r.ErrMessage)
	}
	described, err := adm.DescribeTopicConfigs(context.Background(), topic)
	require.NoError(t, err)
	rc, err := described.On(topic, nil)
	require.NoError(t, err)
	for _, cfg := range rc.Configs {
		if cfg.Key == name {
			require.Equal(t, value, cfg.MaybeValue())
			return
		}
	}
	t.Fatalf("topic %s does not report %s", topic, name)
}

// randomPayload is n incompressible bytes, so that the client's compression cannot
// bring a batch under the broker's limit.
func randomPayload(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// TestBatchOverTheTopicLimitFailsOnlyWhatIsTooLargeAlone publishes 40 messages of
// about 1 KB, over five keys and three partitions, to a topic whose max.message.bytes
// is 8000: each fits, their batches do not. With them goes one message of 9000 bytes,
// which the topic refuses even on its own. Every message that fits must be published,
// in its key's order, and only the oversized one reported failed, permanently, as too
// large. With the topic's limit described and without (no DESCRIBE_CONFIGS
// permission: the transport then sends one record at a time).
func TestBatchOverTheTopicLimitFailsOnlyWhatIsTooLargeAlone(t *testing.T) {
	t.Parallel()
	for _, described := range []bool{true, false} {
		t.Run(fmt.Sprintf("described=%v", described), func(t *testing.T) {
			t.Parallel()
			const topic = "capped"
			c := newCluster(t, 3, topic)
			setTopicConfig(t, c, topic, "max.message.bytes", "8000")
			if !described {
				c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.DescribeConfigs}, Err: kerr.TopicAuthorizationFailed, Count: -1})
			}
			produces := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Observe: true, Count: -1})
			// An ack timeout no busy machine reaches: the outcome must not depend on it.
			tr := newTransport(t, c, kafkatransport.Config{AckTimeout: 2 * time.Minute})

			var batch []*driver.Envelope
			for i := range 40 {
				batch = append(batch, envelope(t, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", i%5), Payload: randomPayload(1000)}))
			}
			big := envelope(t, outbox.Message{Topic: topic, Key: []byte("big"), Payload: randomPayload(9000)})
			batch = append(batch[:20:20], append([]*driver.Envelope{big}, batch[20:]...)...)

			start := time.Now()
			err := tr.Publish(context.Background(), batch)
			t.Logf("Publish took %s", time.Since(start))
			var pe *driver.PublishError
			require.ErrorAs(t, err, &pe)
			require.Len(t, pe.Failed, 1, "only the oversized message fails: %v", err)
			assert.Equal(t, big.ID, pe.Failed[0].ID)
			assert.True(t, driver.IsPermanent(pe.Failed[0].Err), "%v", pe.Failed[0].Err)
			assert.ErrorIs(t, pe.Failed[0].Err, outbox.ErrTooLarge)
			assert.ErrorIs(t, pe.Failed[0].Err, kerr.MessageTooLarge)
			assert.Contains(t, pe.Failed[0].Err.Error(), "on its own")

			got := decodeAll(t, newConsumer(t, c, topic).readAll(t, len(batch)-1))
			requireKeyOrder(t, batch, got, big.ID)
			t.Logf("%d produce requests for %d messages", produces.Hits(), len(batch))
			if described {
				// The described limit lets records share requests; without it they go
				// one at a time.
				assert.Less(t, produces.Hits(), len(batch), "records paced by the topic's limit share produce requests")
			}
		})
	}
}

// requireKeyOrder checks that got holds every envelope of batch but except, once
// each, and each key's in batch order.
func requireKeyOrder(t *testing.T, batch []*driver.Envelope, got []kafkatransport.Delivery, except ...uuid.UUID) {
	t.Helper()
	skip := map[uuid.UUID]bool{}
	for _, id := range except {
		skip[id] = true
	}
	want := map[string][]uuid.UUID{}
	for _, env := range batch {
		if !skip[env.ID] {
			want[string(env.Key)] = append(want[string(env.Key)], env.ID)
		}
	}
	seen := map[uuid.UUID]bool{}
	byKey := map[string][]uuid.UUID{}
	for _, d := range got {
		require.False(t, skip[d.ID], "message %s was reported failed but the broker has it", d.ID)
		require.False(t, seen[d.ID], "message %s delivered twice", d.ID)
		seen[d.ID] = true
		byKey[string(d.Key)] = append(byKey[string(d.Key)], d.ID)
	}
	require.Equal(t, want, byKey, "every message that fits is delivered once, in its key's order")
}

// TestConcurrentPublishesShareTheTopicLimit: three Publish calls at once to a topic
// whose max.message.bytes is 8000, each with batches over it. The client puts their
// records in the same batches; the transport must keep the total it hands over within
// the topic's limit, so that no message is failed for another call's.
func TestConcurrentPublishesShareTheTopicLimit(t *testing.T) {
	t.Parallel()
	const topic = "shared-cap"
	c := newCluster(t, 1, topic)
	setTopicConfig(t, c, topic, "max.message.bytes", "8000")
	tr := newTransport(t, c, kafkatransport.Config{AckTimeout: 2 * time.Minute})

	var (
		all   []*driver.Envelope
		wg    sync.WaitGroup
		errs  = make([]error, 3)
		calls = make([][]*driver.Envelope, 3)
	)
	for n := range calls {
		for i := range 15 {
			calls[n] = append(calls[n], envelope(t, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "call-%d-key-%d", n, i%3), Payload: randomPayload(1000)}))
		}
		all = append(all, calls[n]...)
	}
	for n := range calls {
		wg.Go(func() { errs[n] = tr.Publish(context.Background(), calls[n]) })
	}
	wg.Wait()
	for n, err := range errs {
		require.NoError(t, err, "call %d", n)
	}
	requireKeyOrder(t, all, decodeAll(t, newConsumer(t, c, topic).readAll(t, len(all))))
}

// TestUnknownTopicIsReportedAtOnceBesideTheOthers publishes a batch mixing a topic
// that exists and one that does not, on a client with kgo's defaults. The existing
// topic's messages are acknowledged; the others are reported failed as a topic that
// does not exist, without waiting out the ack timeout (two minutes here, so the
// outcome cannot come from it).
func TestUnknownTopicIsReportedAtOnceBesideTheOthers(t *testing.T) {
	t.Parallel()
	for _, permanent := range []bool{false, true} {
		t.Run(fmt.Sprintf("permanent=%v", permanent), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, 2, "exists")
			tr := newTransport(t, c, kafkatransport.Config{AckTimeout: 2 * time.Minute, UnknownTopicPermanent: permanent})
			var batch []*driver.Envelope
			lost := map[uuid.UUID]bool{}
			for i := range 12 {
				msg := outbox.Message{Topic: "exists", Key: fmt.Appendf(nil, "k%d", i%4), Payload: fmt.Appendf(nil, "%d", i)}
				if i%4 == 1 {
					msg.Topic = "nowhere"
				}
				if i == 5 {
					msg.Key = nil // keyless too
				}
				env := envelope(t, msg)
				batch = append(batch, env)
				if msg.Topic == "nowhere" {
					lost[env.ID] = true
				}
			}
			start := time.Now()
			err := tr.Publish(context.Background(), batch)
			t.Logf("Publish took %s", time.Since(start))
			var pe *driver.PublishError
			require.ErrorAs(t, err, &pe)
			require.Len(t, pe.Failed, len(lost), "only the unknown topic's messages fail: %v", err)
			for _, f := range pe.Failed {
				assert.True(t, lost[f.ID], "message %s of the existing topic failed: %v", f.ID, f.Err)
				assert.ErrorIs(t, f.Err, kerr.UnknownTopicOrPartition)
				assert.Contains(t, f.Err.Error(), `topic "nowhere" does not exist`)
				assert.Equal(t, permanent, driver.IsPermanent(f.Err), "%v", f.Err)
			}
			// The existing topic's messages were acknowledged: the topic has them.
			want := map[uuid.UUID]bool{}
			for _, env := range batch {
				if !lost[env.ID] {
					want[env.ID] = true
				}
			}
			got := map[uuid.UUID]bool{}
			for _, d := range decodeAll(t, newConsumer(t, c, "exists").readAll(t, len(want))) {
				got[d.ID] = true
			}
			assert.Equal(t, want, got)
		})
	}
}

// TestTopicTheBrokerCreatesIsNotReportedMissing: with auto-creation allowed on the
// client and the broker, the look-up lets the broker create the topic, as the
// client's own metadata requests do, and the message is published.
func TestTopicTheBrokerCreatesIsNotReportedMissing(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation())
	require.NoError(t, err)
	t.Cleanup(c.Close)
	tr := newTransport(t, c, kafkatransport.Config{AckTimeout: 2 * time.Minute}, kgo.AllowAutoTopicCreation())
	env := envelope(t, outbox.Message{Topic: "created-on-use", Key: []byte("k"), Payload: []byte("first")})
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{env}))
	assert.Equal(t, env.ID, decodeAll(t, newConsumer(t, c, "created-on-use").read(t, 1))[0].ID)
}
