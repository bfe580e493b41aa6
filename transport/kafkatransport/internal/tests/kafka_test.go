package tests

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

func TestPublishPassesBytesThroughUnchanged(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "orders")
	tr := newTransport(t, c, kafkatransport.Config{})
	binary := []byte{0, 0xff, 0xfe, '\n', 0x80}
	msgs := []outbox.Message{
		{Topic: "orders", Key: []byte("k1"), Payload: []byte("hello")},
		{Topic: "orders", Key: nil, Payload: binary},                   // keyless
		{Topic: "orders", Key: []byte{}, Payload: []byte("empty key")}, // empty, non-nil key
		{Topic: "orders", Key: []byte("k1"), Payload: nil},             // tombstone
		{Topic: "orders", Key: binary, Payload: []byte{}},              // empty payload
		{Topic: "orders", Key: []byte("k2"), Payload: []byte("headers"), Headers: []outbox.Header{
			{Key: "a", Value: []byte("1")},
			{Key: "a", Value: []byte("2")}, // duplicates keep their order
			{Key: "empty", Value: []byte{}},
			{Key: "bin", Value: binary},
			{Key: outbox.HeaderIdempotencyKey, Value: []byte("app-chosen")},
		}},
	}
	batch := make([]*driver.Envelope, len(msgs))
	for i, m := range msgs {
		batch[i] = envelope(t, m)
	}
	require.NoError(t, tr.Publish(context.Background(), batch))

	got := decodeAll(t, newConsumer(t, c, "orders").read(t, len(msgs)))
	for i, d := range got {
		want := batch[i]
		assert.Equal(t, want.ID, d.ID, "message %d", i)
		assert.Equal(t, "orders", d.Topic)
		assert.Equal(t, want.Key, d.Key, "key of message %d", i)
		assert.Equal(t, want.Key == nil, d.Key == nil, "nil key of message %d", i)
		assert.Equal(t, want.Payload, d.Payload, "payload of message %d", i)
		assert.Equal(t, want.Payload == nil, d.Payload == nil, "tombstone of message %d", i)
		assert.Equal(t, int32(0), *d.Partition)

		// The application's headers come first, unchanged, then the stamped ones.
		require.GreaterOrEqual(t, len(d.Headers), len(want.Headers)+1)
		for j, h := range want.Headers {
			assert.Equal(t, h.Key, d.Headers[j].Key)
			assert.Equal(t, h.Value, d.Headers[j].Value)
		}
		id, ok := d.Header(outbox.HeaderMessageID)
		require.True(t, ok)
		assert.Equal(t, want.ID.String(), string(id))
		key, ok := d.Header(outbox.HeaderIdempotencyKey)
		require.True(t, ok)
		if i == len(msgs)-1 {
			assert.Equal(t, "app-chosen", string(key), "an application's idempotency key is kept")
			assert.Len(t, d.Headers, len(want.Headers)+1)
		} else {
			assert.Equal(t, want.ID.String(), string(key))
			assert.Len(t, d.Headers, len(want.Headers)+2)
		}
	}
	// Publishing must not have grown the envelopes' own headers.
	assert.Empty(t, batch[0].Headers)
}

func TestOmitIdempotencyKey(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "t")
	tr := newTransport(t, c, kafkatransport.Config{OmitIdempotencyKey: true})
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{envelope(t, outbox.Message{Topic: "t", Payload: []byte("x")})}))
	d := decodeAll(t, newConsumer(t, c, "t").read(t, 1))[0]
	_, ok := d.Header(outbox.HeaderIdempotencyKey)
	assert.False(t, ok)
	_, ok = d.Header(outbox.HeaderMessageID)
	assert.True(t, ok)
}

func TestKeysLandWhereTheOutboxBucketsThem(t *testing.T) {
	t.Parallel()
	const partitions = 8
	c := newCluster(t, partitions, "keyed")
	tr := newTransport(t, c, kafkatransport.Config{})
	var batch []*driver.Envelope
	for i := range 200 {
		batch = append(batch, envelope(t, outbox.Message{Topic: "keyed", Key: fmt.Appendf(nil, "customer-%d", i), Payload: []byte("p")}))
	}
	require.NoError(t, tr.Publish(context.Background(), batch))

	byID := map[uuid.UUID]*driver.Envelope{}
	for _, env := range batch {
		byID[env.ID] = env
	}
	seen := map[int32]bool{}
	for _, d := range decodeAll(t, newConsumer(t, c, "keyed").read(t, len(batch))) {
		env := byID[d.ID]
		require.NotNil(t, env)
		want := driver.BucketOf(&env.Message, partitions)
		assert.Equal(t, int32(want), *d.Partition, "key %q", env.Key)
		seen[*d.Partition] = true
	}
	assert.Len(t, seen, partitions, "200 keys should reach every partition")
}

func TestExplicitPartitionNeedsThePartitioner(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 4, "pinned")
	tr := newTransport(t, c, kafkatransport.Config{})
	env := envelope(t, outbox.Message{Topic: "pinned", Key: []byte("k"), Partition: ptr(3)})
	err := tr.Publish(context.Background(), []*driver.Envelope{env})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	assert.True(t, driver.IsPermanent(pe.Failed[0].Err))
	assert.ErrorIs(t, pe.Failed[0].Err, outbox.ErrMisconfigured)
	assert.Contains(t, err.Error(), "kafkatransport.Partitioner")
}

func ptr(n int32) *int32 { return &n }

// TestPartitionerHonoursExplicitPartitions checks the partitioner over fallbacks with
// each combination of kgo's optional partitioner interfaces.
func TestPartitionerHonoursExplicitPartitions(t *testing.T) {
	t.Parallel()
	fallbacks := map[string]struct {
		p kgo.Partitioner
		// hashesKeys: keyed records land as Kafka's default partitioner puts them.
		hashesKeys bool
	}{
		"default":     {nil, true},                           // backup + keys
		"sticky-key":  {kgo.StickyKeyPartitioner(nil), true}, // on-new-batch
		"round-robin": {kgo.RoundRobinPartitioner(), false},  // neither
		"least":       {kgo.LeastBackupPartitioner(), false}, // backup
	}
	for name, fb := range fallbacks {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, 4, "pinned")
			tr := newTransport(t, c, kafkatransport.Config{}, kgo.RecordPartitioner(kafkatransport.Partitioner(fb.p)))
			var batch []*driver.Envelope
			for i := range 40 {
				batch = append(batch, envelope(t, outbox.Message{Topic: "pinned", Key: fmt.Appendf(nil, "k%d", i), Partition: ptr(int32(i % 4))}))
			}
			keyed := envelope(t, outbox.Message{Topic: "pinned", Key: []byte("no partition")})
			keyless := envelope(t, outbox.Message{Topic: "pinned", Payload: []byte("anywhere")})
			missing := envelope(t, outbox.Message{Topic: "pinned", Key: []byte("k"), Partition: ptr(9)})
			batch = append(batch, keyed, keyless, missing)

			err := tr.Publish(context.Background(), batch)
			var pe *driver.PublishError
			require.ErrorAs(t, err, &pe)
			require.Len(t, pe.Failed, 1, "only the missing partition fails: %v", err)
			assert.Equal(t, missing.ID, pe.Failed[0].ID)
			assert.True(t, driver.IsPermanent(pe.Failed[0].Err))
			assert.Contains(t, pe.Failed[0].Err.Error(), "no partition 9")

			byID := map[uuid.UUID]*driver.Envelope{}
			for _, env := range batch {
				byID[env.ID] = env
			}
			explicit := 0
			for _, d := range decodeAll(t, newConsumer(t, c, "pinned").read(t, len(batch)-1)) {
				env := byID[d.ID]
				require.NotNil(t, env)
				switch {
				case env.Partition != nil:
					explicit++
					assert.Equal(t, *env.Partition, *d.Partition)
				case env == keyed && fb.hashesKeys:
					assert.Equal(t, int32(driver.BucketOf(&env.Message, 4)), *d.Partition)
				}
			}
			assert.Equal(t, 40, explicit)
		})
	}
}

// The relay suite's SizeLimit/HoldsBackItsKey checks what a refused message's key
// reports; this checks that Kafka does not send the held-back record at all.
func TestRefusedMessageHoldsBackItsKey(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "held")
	tr := newTransport(t, c, kafkatransport.Config{MaxMessageSize: 4096})
	first := envelope(t, outbox.Message{Topic: "held", Key: []byte("k"), Payload: []byte("1")})
	big := envelope(t, outbox.Message{Topic: "held", Key: []byte("k"), Payload: make([]byte, 5000)})
	later := envelope(t, outbox.Message{Topic: "held", Key: []byte("k"), Payload: []byte("3")})
	keyless := envelope(t, outbox.Message{Topic: "held", Payload: []byte("5")})

	err := tr.Publish(context.Background(), []*driver.Envelope{first, big, later, keyless})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 2)
	assert.Equal(t, big.ID, pe.Failed[0].ID)
	assert.True(t, driver.IsPermanent(pe.Failed[0].Err))
	assert.Equal(t, later.ID, pe.Failed[1].ID)
	assert.False(t, driver.IsPermanent(pe.Failed[1].Err), "a held-back message succeeds once its predecessor is parked")

	got := decodeAll(t, newConsumer(t, c, "held").readAll(t, 2))
	require.Len(t, got, 2)
	assert.Equal(t, first.ID, got[0].ID)
	assert.Equal(t, keyless.ID, got[1].ID)
}

// The limit leaves room for the framing of 28 headers; a message within it with many
// more can still exceed the client's batches, and is then refused before sending,
// permanently.
func TestManyHeadersAreMeasuredOnTheWire(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "headers")
	// Batches of 2 KiB leave a default MaxMessageSize of 1536 bytes.
	tr := newTransport(t, c, kafkatransport.Config{}, kgo.ProducerBatchMaxBytes(2048))
	require.Equal(t, 1536, tr.MaxMessageSize())
	msg := outbox.Message{Topic: "headers", Key: []byte("k"), Payload: make([]byte, 1300)}
	for range 50 {
		msg.Headers = append(msg.Headers, outbox.Header{Key: "h", Value: []byte{}})
	}
	require.Less(t, msg.Size(), tr.MaxMessageSize())
	env := envelope(t, msg)
	err := tr.Publish(context.Background(), []*driver.Envelope{env})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	assert.True(t, driver.IsPermanent(pe.Failed[0].Err))
	assert.ErrorIs(t, pe.Failed[0].Err, outbox.ErrTooLarge)
	assert.Contains(t, err.Error(), "as a record")

	// With 28 headers it fits, even at exactly the limit, and is delivered.
	msg.Headers = msg.Headers[:28]
	msg.Payload = make([]byte, len(msg.Payload)+tr.MaxMessageSize()-msg.Size())
	require.Equal(t, tr.MaxMessageSize(), msg.Size())
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{envelope(t, msg)}))
}

func TestBrokerSizeRefusalIsPermanent(t *testing.T) {
	t.Parallel()
	// The broker accepts batches of at most 2 KiB, far below the client's limit, so
	// the refusal comes from the broker's answer.
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "small"),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": "2048"}))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	tr := newTransport(t, c, kafkatransport.Config{}, kgo.ProducerBatchCompression(kgo.NoCompression()))
	payload := make([]byte, 4096)
	_, _ = rand.Read(payload)
	big := envelope(t, outbox.Message{Topic: "small", Key: []byte("k"), Payload: payload})
	err = tr.Publish(context.Background(), []*driver.Envelope{big})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	assert.True(t, driver.IsPermanent(pe.Failed[0].Err), "%v", err)
	assert.ErrorIs(t, pe.Failed[0].Err, outbox.ErrTooLarge)
	assert.ErrorIs(t, pe.Failed[0].Err, kerr.MessageTooLarge)
}

func TestUnknownTopic(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "exists")
	for _, permanent := range []bool{false, true} {
		t.Run(fmt.Sprintf("permanent=%v", permanent), func(t *testing.T) {
			t.Parallel()
			tr := newTransport(t, c, kafkatransport.Config{UnknownTopicPermanent: permanent},
				kgo.UnknownTopicRetries(1), kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }))
			ok := envelope(t, outbox.Message{Topic: "exists", Payload: []byte("fine")})
			lost := envelope(t, outbox.Message{Topic: "nowhere", Payload: []byte("lost")})
			err := tr.Publish(context.Background(), []*driver.Envelope{ok, lost})
			var pe *driver.PublishError
			require.ErrorAs(t, err, &pe)
			require.Len(t, pe.Failed, 1)
			assert.Equal(t, lost.ID, pe.Failed[0].ID)
			assert.ErrorIs(t, pe.Failed[0].Err, kerr.UnknownTopicOrPartition)
			assert.Equal(t, permanent, driver.IsPermanent(pe.Failed[0].Err))
		})
	}
}

func TestAuthorizationFailureIsPermanent(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, "open", "secret")
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "secret", Err: kerr.TopicAuthorizationFailed, Count: -1})
	tr := newTransport(t, c, kafkatransport.Config{})
	open := envelope(t, outbox.Message{Topic: "open", Key: []byte("a"), Payload: []byte("1")})
	secret := envelope(t, outbox.Message{Topic: "secret", Key: []byte("a"), Payload: []byte("2")})
	err := tr.Publish(context.Background(), []*driver.Envelope{open, secret})
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, 1)
	assert.Equal(t, secret.ID, pe.Failed[0].ID)
	assert.True(t, driver.IsPermanent(pe.Failed[0].Err))
	assert.ErrorIs(t, pe.Failed[0].Err, kerr.TopicAuthorizationFailed)
	assert.Equal(t, open.ID, decodeAll(t, newConsumer(t, c, "open").read(t, 1))[0].ID)
}

// TestPartialOutageReportsExactlyWhatTheBrokerDidNotTake refuses produce requests for
// half the partitions of a topic with a retriable error while the rest are served:
// the failed messages must be reported transient, and the topic must hold exactly
// the others.
func TestPartialOutageReportsExactlyWhatTheBrokerDidNotTake(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 4, "flaky")
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "flaky", Partitions: []int32{1, 3}, Err: kerr.NotLeaderForPartition, Count: -1})
	tr := newTransport(t, c, kafkatransport.Config{}, kgo.RecordRetries(3), kgo.MetadataMinAge(10*time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 10 * time.Millisecond }))

	var batch []*driver.Envelope
	for i := range 60 {
		batch = append(batch, envelope(t, outbox.Message{Topic: "flaky", Key: fmt.Appendf(nil, "key-%d", i%12), Payload: fmt.Appendf(nil, "%d", i)}))
	}
	err := tr.Publish(context.Background(), batch)
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	failed := map[uuid.UUID]bool{}
	for _, f := range pe.Failed {
		assert.False(t, driver.IsPermanent(f.Err), "a refusing leader is transient: %v", f.Err)
		failed[f.ID] = true
	}
	wantFailed := 0
	for _, env := range batch {
		p := driver.BucketOf(&env.Message, 4)
		if p == 1 || p == 3 {
			wantFailed++
			assert.True(t, failed[env.ID], "message on refused partition %d not reported", p)
		}
	}
	require.Equal(t, wantFailed, len(failed))
	require.NotZero(t, wantFailed)
	require.Less(t, wantFailed, len(batch))
	h.Remove()

	got := decodeAll(t, newConsumer(t, c, "flaky").readAll(t, len(batch)-wantFailed))
	require.Len(t, got, len(batch)-wantFailed)
	for _, d := range got {
		assert.False(t, failed[d.ID], "message %s reported failed but the broker has it", d.ID)
	}

	// Once the partitions serve again, the failed messages publish.
	var retry []*driver.Envelope
	for _, env := range batch {
		if failed[env.ID] {
			retry = append(retry, env)
		}
	}
	require.NoError(t, tr.Publish(context.Background(), retry))
}

// TestClusterDownMidBatch stops every broker while a batch waits for its
// acknowledgements. The idempotent producer cannot withdraw records it sent, so
// Publish gives up after AckTimeout and reports every message failed, transient.
func TestClusterDownMidBatch(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, "down")
	tr := newTransport(t, c, kafkatransport.Config{AckTimeout: time.Second})
	// Warm up so that metadata and the producer id are in place.
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{envelope(t, outbox.Message{Topic: "down", Payload: []byte("warm")})}))

	// Take the next produce request and close the cluster under it.
	held := make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		close(held)
		return nil, errors.New("broker going away"), true
	})
	batch := outageBatch(t, "down")
	result := make(chan error, 1)
	go func() { result <- tr.Publish(context.Background(), batch) }()
	<-held
	c.Close()
	requireAllTransient(t, <-result, batch)
}

// TestClusterDownBeforeBatch publishes to a cluster that is gone.
func TestClusterDownBeforeBatch(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, "gone")
	tr := newTransport(t, c, kafkatransport.Config{AckTimeout: time.Second})
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{envelope(t, outbox.Message{Topic: "gone", Payload: []byte("warm")})}))
	c.Close()
	batch := outageBatch(t, "gone")
	requireAllTransient(t, tr.Publish(context.Background(), batch), batch)
}

func requireAllTransient(t *testing.T, err error, batch []*driver.Envelope) {
	t.Helper()
	var pe *driver.PublishError
	require.ErrorAs(t, err, &pe)
	require.Len(t, pe.Failed, len(batch), "no message may be reported sent")
	ids := map[uuid.UUID]bool{}
	for _, f := range pe.Failed {
		assert.False(t, driver.IsPermanent(f.Err), "an outage is transient: %v", f.Err)
		ids[f.ID] = true
	}
	for _, env := range batch {
		assert.True(t, ids[env.ID])
	}
}

func outageBatch(t *testing.T, topic string) []*driver.Envelope {
	var batch []*driver.Envelope
	for i := range 20 {
		batch = append(batch, envelope(t, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "%d", i), Payload: []byte("x")}))
	}
	return batch
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "t")
	tr := newTransport(t, c, kafkatransport.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := tr.Publish(ctx, []*driver.Envelope{envelope(t, outbox.Message{Topic: "t"})})
	assert.Equal(t, context.Canceled, err, "context errors come back unwrapped")
	require.NoError(t, tr.Publish(context.Background(), nil))
}

// TestPublishReturnsWhenContextEndsWhileBrokerIsSilent holds a produce request
// unanswered: Publish must give up when its context ends.
func TestPublishReturnsWhenContextEndsWhileBrokerIsSilent(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "silent")
	tr := newTransport(t, c, kafkatransport.Config{})
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{envelope(t, outbox.Message{Topic: "silent", Payload: []byte("warm")})}))
	wake := make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { <-wake })
		return nil, nil, false
	})
	t.Cleanup(func() { close(wake) })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := tr.Publish(ctx, []*driver.Envelope{envelope(t, outbox.Message{Topic: "silent", Payload: []byte("x")})})
	assert.Equal(t, context.DeadlineExceeded, err)
}

func TestMessageIDHeaderIsStampedOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, "ids")
	tr := newTransport(t, c, kafkatransport.Config{})
	forwarded := envelope(t, outbox.Message{Topic: "ids", Payload: []byte("forwarded"),
		Headers: []outbox.Header{{Key: outbox.HeaderMessageID, Value: []byte(uuid.NewString())}}})
	own := envelope(t, outbox.Message{Topic: "ids", Payload: []byte("own")})
	own.Headers = []outbox.Header{{Key: outbox.HeaderMessageID, Value: []byte(own.ID.String())}}
	require.NoError(t, tr.Publish(context.Background(), []*driver.Envelope{forwarded, own}))

	got := decodeAll(t, newConsumer(t, c, "ids").read(t, 2))
	// A message id from an earlier hop stays; the outbox's own comes last and wins.
	assert.Equal(t, forwarded.ID, got[0].ID)
	assert.Len(t, got[0].Headers, 3)
	assert.Equal(t, forwarded.Headers[0], got[0].Headers[0])
	// A header that already names the envelope is not repeated.
	assert.Equal(t, own.ID, got[1].ID)
	assert.Len(t, got[1].Headers, 2)
}
