package kafkatransport

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// DefaultMaxMessageSize is Kafka's default limit on one message (1 MiB). The
// effective default is lowered to what the client's batches can carry; see
// [Config.MaxMessageSize].
const DefaultMaxMessageSize = 1 << 20

// framingAllowance is the room [Config.MaxMessageSize] leaves in a producer batch
// beyond the message's own bytes: the record batch header, the record's own fields,
// the two headers the transport adds and the framing of up to coveredHeaders
// application headers.
const framingAllowance = 512

// Wire sizes of Kafka's record batch format (v2), for the bound in wireSize.
const (
	defaultBatchMaxBytes = 1_000_012 // kgo's default ProducerBatchMaxBytes
	// batchHeaderSize is a record batch without records as kgo counts it against
	// ProducerBatchMaxBytes: Kafka's 61-byte header and the 4-byte array length.
	batchHeaderSize = 65
	maxVarint       = 5
	// recordFraming bounds a record's own fields: length, attributes, timestamp and
	// offset deltas, key and value lengths, header count.
	recordFraming = 6*maxVarint + 1 + 10
	// headerFraming bounds one header's key and value lengths.
	headerFraming = 2 * maxVarint
	// uuidText is the length of a message id as stamped.
	uuidText = 36
	// stampedHeaders bounds the two headers the transport adds.
	stampedHeaders = 2*headerFraming + len(outbox.HeaderMessageID) + len(outbox.HeaderIdempotencyKey) + 2*uuidText
	// coveredHeaders is how many application headers framingAllowance always has
	// room for (28): a message within MaxMessageSize with at most this many headers
	// fits the client's batches.
	coveredHeaders = (framingAllowance - batchHeaderSize - recordFraming - stampedHeaders) / headerFraming
)

// Config tunes a [Transport]. The zero value is ready to use.
type Config struct {
	// MaxMessageSize is the largest [outbox.Message.Size] (of the message as
	// captured) the transport publishes; [Transport.MaxMessageSize] reports it. A
	// larger message fails permanently, wrapping [outbox.ErrTooLarge], without being
	// sent; capture refuses it at Send when the transport is wired in through
	// outbox.SenderConfig.Transport. Defaults to 1 MiB (Kafka's default message
	// limit), lowered to the client's ProducerBatchMaxBytes (kgo's default is
	// 1,000,012 bytes) less 512 bytes of framing. It may not exceed that either:
	// raise kgo.ProducerBatchMaxBytes (and the topic's max.message.bytes) first. The
	// 512 bytes hold the record's framing, the headers the transport adds, and the
	// framing of 28 application headers, so a message within the limit with at most
	// 28 headers always fits the client's batches.
	MaxMessageSize int

	// OmitIdempotencyKey stops the transport from adding an [outbox.HeaderIdempotencyKey]
	// header (set to the message id) to messages captured without one. It is the only
	// switch for that header: capture never adds it. Defaults to false: every record
	// carries the header.
	OmitIdempotencyKey bool

	// UnknownTopicPermanent reports a topic the cluster does not have as a permanent
	// failure, so the relay parks its messages at once. Defaults to false: the
	// failure is transient and the relay retries the messages with backoff (parking
	// them after its MaxAttempts), which suits topics created by a deployment that may
	// lag the application. Either way the failure names the topic and says it does not
	// exist, and comes at once: Publish looks up topics the client's metadata does not
	// have yet before producing, instead of leaving the records to wait in the client
	// (see [Transport.Publish]).
	UnknownTopicPermanent bool

	// AllowNonIdempotent accepts a client built with kgo.DisableIdempotentWrite, for
	// clusters where the producer lacks the IDEMPOTENT_WRITE permission. Retried
	// produce requests can then write duplicates and reorder a key's records.
	// Defaults to false: New refuses such a client.
	AllowNonIdempotent bool

	// AckTimeout bounds a Publish call: it returns within AckTimeout, which
	// [Transport.PublishTimeout] reports, so that a relay can check that a publish
	// fits in its lease. Halfway through, Publish starts no new produce round and
	// withdraws from the client every record it has not sent yet; records already sent
	// cannot be withdrawn (an idempotent producer waits for the broker's answer), so
	// Publish waits for those for the rest of AckTimeout. A record is reported failed,
	// transient, only once the client no longer holds it — or, if the broker has not
	// answered by AckTimeout, reported failed with the warning that the client may
	// still deliver it. If ctx ends first (the relay ends it before the bucket's lease
	// runs out), Publish returns ctx's error; the records still on the wire may then
	// reach the broker after the lease, as duplicates of what the bucket's next owner
	// publishes (see the package documentation, "A cut publish"). Defaults to 10 s; a
	// negative value waits until ctx ends.
	AckTimeout time.Duration
}

// DefaultAckTimeout is the default [Config.AckTimeout].
const DefaultAckTimeout = 10 * time.Second

// Validate reports the first setting that cannot work, naming its field. Zero values
// are valid: they take their defaults. [New] also checks MaxMessageSize against what
// the client's batches carry.
func (c Config) Validate() error {
	return transportkit.Positive("kafkatransport", "Config.MaxMessageSize", c.MaxMessageSize, "the default")
}

// Transport publishes outbox envelopes to Kafka through a franz-go client. It is safe
// for concurrent use. [Transport.Close] ends it.
type Transport struct {
	client *kgo.Client
	cfg    Config
	// explicitPartitions records whether the client's partitioner honours
	// Message.Partition (it was built with [Partitioner]).
	explicitPartitions bool
	// recordLimit is the most bytes one record may take on the wire: the client's
	// batch limit (batchMax) less the record batch header.
	recordLimit int
	batchMax    int
	// autoCreate records whether the client lets brokers create topics it asks for.
	autoCreate bool

	// tmu guards topics, the per-topic state that pacing shares between Publish
	// calls (topics.go), and wake, closed and replaced whenever a produce round
	// releases what it held.
	tmu    sync.Mutex
	topics map[string]*topicState
	wake   chan struct{}

	// mu guards closed and inflight, the produce calls under way (each in a
	// goroutine of the transport's); drained is closed once Close was called and
	// none is left.
	mu       sync.Mutex
	closed   bool
	inflight int
	drained  chan struct{}
}

// New returns a transport that produces through client. The client is the caller's:
// New never dials and the transport never closes it. Close the transport
// ([Transport.Close]) once nothing publishes through it any more (after the relay
// stopped), and the client after that.
//
// The client must produce durably: acks from all in-sync replicas (kgo's default,
// kgo.RequiredAcks(kgo.AllISRAcks())) and idempotent writes (kgo's default; see
// [Config.AllowNonIdempotent]). It must not be transactional, since the transport
// does not begin or end transactions. New returns an error wrapping
// [outbox.ErrMisconfigured] otherwise, or when cfg is invalid ([Config.Validate], and
// a MaxMessageSize the client's batches cannot carry).
//
// To publish messages that name a partition, build the client with
// kgo.RecordPartitioner([Partitioner](nil)); without it, such messages fail
// permanently.
func New(client *kgo.Client, cfg Config) (*Transport, error) {
	if err := transportkit.CheckArgs(client == nil, "kafkatransport: client is nil: pass a *kgo.Client built with kgo.NewClient", cfg); err != nil {
		return nil, err
	}
	if acks, _ := client.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		return nil, fmt.Errorf("%w: kafkatransport: client must require acks from all in-sync replicas: drop kgo.RequiredAcks or pass kgo.RequiredAcks(kgo.AllISRAcks())", outbox.ErrMisconfigured)
	}
	if disabled, _ := client.OptValue(kgo.DisableIdempotentWrite).(bool); disabled && !cfg.AllowNonIdempotent {
		return nil, fmt.Errorf("%w: kafkatransport: client has idempotent writes disabled: drop kgo.DisableIdempotentWrite, or set Config.AllowNonIdempotent to accept duplicates from retried requests", outbox.ErrMisconfigured)
	}
	if txn := client.OptValues(kgo.TransactionalID); len(txn) == 2 && txn[1] == true {
		return nil, fmt.Errorf("%w: kafkatransport: client is transactional (kgo.TransactionalID %q): give the transport a client without a transactional id", outbox.ErrMisconfigured, txn[0])
	}
	batchMax := int(defaultBatchMaxBytes)
	if v, ok := client.OptValue(kgo.ProducerBatchMaxBytes).(int32); ok && v > 0 {
		batchMax = int(v)
	}
	capacity := batchMax - framingAllowance
	switch {
	case cfg.MaxMessageSize == 0:
		cfg.MaxMessageSize = min(DefaultMaxMessageSize, capacity)
	case cfg.MaxMessageSize > capacity:
		return nil, fmt.Errorf("%w: kafkatransport: Config.MaxMessageSize %d exceeds the %d bytes the client's batches carry: raise kgo.ProducerBatchMaxBytes to at least %d", outbox.ErrMisconfigured, cfg.MaxMessageSize, capacity, cfg.MaxMessageSize+framingAllowance)
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	_, explicit := client.OptValue(kgo.RecordPartitioner).(*explicitPartitioner)
	autoCreate, _ := client.OptValue(kgo.AllowAutoTopicCreation).(bool)
	return &Transport{
		client:             client,
		cfg:                cfg,
		explicitPartitions: explicit,
		recordLimit:        batchMax - batchHeaderSize,
		batchMax:           batchMax,
		autoCreate:         autoCreate,
		topics:             map[string]*topicState{},
		wake:               make(chan struct{}),
		drained:            make(chan struct{}),
	}, nil
}

// errClosed is returned by Publish and Ping after Close.
var errClosed = fmt.Errorf("%w: kafkatransport: the transport was closed", outbox.ErrClosed)

// Close ends the transport: later calls to [Transport.Publish] and [Transport.Ping]
// return an error wrapping [outbox.ErrClosed], and Close returns once every produce
// call the transport started has ended. A Publish under way when Close is called
// finishes, but starts no new produce call (the records it would have produced again
// are reported failed, wrapping ErrClosed).
//
// A produce call ends when the client has resolved all of its records: the broker
// acknowledged them, or the client failed them. Publish can return before that — when
// its ctx ends (the relay's Stop ends it) or once [Config.AckTimeout] has passed — and
// records already sent to a broker that does not answer stay with the client; Close
// waits for them. If ctx ends first, Close returns an error wrapping ctx's error,
// naming how many produce calls are still under way; they end once the client
// resolves their records, at the latest when the caller closes the client
// (kgo.Client.Close fails every record it still holds). Close may be called again to
// keep waiting; once everything has ended it returns nil at once.
//
// Close does not close the client, which is the caller's. Shut down in this order:
//
//	err := r.Stop(ctx)            // the relay: no Publish after this
//	err = transport.Close(ctx)    // the produce calls the transport started
//	client.Close()                // the caller's client, last
func (t *Transport) Close(ctx context.Context) error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		if t.inflight == 0 {
			close(t.drained)
		}
	}
	t.mu.Unlock()
	select {
	case <-t.drained:
		return nil
	default:
	}
	select {
	case <-t.drained:
		return nil
	case <-ctx.Done():
		t.mu.Lock()
		n := t.inflight
		t.mu.Unlock()
		calls := fmt.Sprintf("%d produce calls are", n)
		if n == 1 {
			calls = "1 produce call is"
		}
		return fmt.Errorf("kafkatransport: close: %s still under way, their records with the client (closing the client fails them): %w", calls, ctx.Err())
	}
}

// begin counts a produce call about to start; it reports false after Close.
func (t *Transport) begin() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.inflight++
	return true
}

// end counts a produce call that ended.
func (t *Transport) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inflight--
	if t.closed && t.inflight == 0 {
		close(t.drained)
	}
}

// isClosed reports whether Close was called.
func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// KeepsKeyOrder implements [driver.KeyOrderKeeper]: a message the transport refuses
// holds back its key's later messages in the batch, and the client fails a
// partition's later buffered records when a produce request fails. The relay
// therefore sends a key's messages together in one Publish call.
func (t *Transport) KeepsKeyOrder() bool { return true }

// MaxMessageSize implements [driver.SizeLimiter]: [Config.MaxMessageSize], or its
// default. Capture refuses a larger message at Send, before anything is written, when
// the transport is wired in: outbox.NewSender(store, outbox.SenderConfig{Transport: t}).
// Publish refuses it permanently, wrapping [outbox.ErrTooLarge].
func (t *Transport) MaxMessageSize() int { return t.cfg.MaxMessageSize }

// As reaches the underlying client: target must be a **kgo.Client.
func (t *Transport) As(target any) bool {
	if p, ok := target.(**kgo.Client); ok {
		*p = t.client
		return true
	}
	return false
}

// Publish produces every envelope of the batch and waits for the broker's
// acknowledgements, for at most [Config.AckTimeout]. It returns nil when every record
// was acknowledged, a [*driver.PublishError] naming the envelopes that were not (each
// cause marked [driver.Permanent] when retrying cannot help), or ctx's error when ctx
// ended first (then nothing may be assumed sent). After [Transport.Close] it returns
// an error wrapping [outbox.ErrClosed] and sends nothing.
//
// Records of a topic the cluster does not have fail at once, named as such, without
// holding up the batch's other records (see [Config.UnknownTopicPermanent]). Records
// of a topic whose brokers refuse a batch as too large are produced again in batches
// within the topic's max.message.bytes; only a record refused on its own fails as too
// large.
func (t *Transport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if t.isClosed() {
		return errClosed
	}
	return transportkit.Publish(ctx, batch, t.publish)
}

// publish sends batch for [transportkit.Publish], recording in errs why each envelope
// failed.
func (t *Transport) publish(ctx context.Context, batch []*driver.Envelope, errs []error) error {
	p := t.newPublish(batch, errs)
	defer p.stop()
	send := make([]int, 0, len(batch)) // batch indexes to produce, in batch order
	for i, env := range batch {
		if p.isHeld(i) {
			p.fail(i, errHeldBack)
			continue
		}
		if err := t.check(env); err != nil {
			p.fail(i, err)
			continue
		}
		send = append(send, i)
	}
	send, err := p.lookUp(ctx, send)
	if err != nil {
		return err
	}
	if len(send) > 0 {
		return p.produce(ctx, send)
	}
	return nil
}

// PublishTimeout implements [driver.PublishTimeouter]: [Config.AckTimeout] (10 s by
// default), within which every Publish call returns. It is 0 when AckTimeout is
// negative: Publish then waits until its context ends.
func (t *Transport) PublishTimeout() time.Duration {
	if t.cfg.AckTimeout < 0 {
		return 0
	}
	return t.cfg.AckTimeout
}

// records builds the records of batch[i] for each i in send, every one with a
// context derived from the returned one, which cut ends.
func (t *Transport) records(batch []*driver.Envelope, send []int) ([]*kgo.Record, context.Context, context.CancelFunc) {
	rctx, cut := context.WithCancel(context.Background())
	recs := make([]kgo.Record, len(send))
	ptrs := make([]*kgo.Record, len(send))
	for j, i := range send {
		env := batch[i]
		recs[j] = kgo.Record{
			Topic:   env.Topic,
			Key:     env.Key,
			Value:   env.Payload,
			Headers: t.headers(env),
			Context: rctx,
		}
		if env.Partition != nil {
			recs[j].Context = withMeta(rctx, &recordMeta{explicit: *env.Partition})
		}
		ptrs[j] = &recs[j]
	}
	return ptrs, rctx, cut
}

// cutOff reports whether the client failed a record because a cut ended the context
// of its partition's buffered records (the records carry no other context that ends).
func cutOff(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, kgo.ErrAborting)
}

// Ping implements [driver.Pinger]: it asks the cluster for its metadata, which
// succeeds when any broker answers. After [Transport.Close] it returns an error
// wrapping [outbox.ErrClosed], and once ctx has ended ctx's error.
func (t *Transport) Ping(ctx context.Context) error {
	if t.isClosed() {
		return errClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := t.client.Ping(ctx); err != nil {
		return fmt.Errorf("kafkatransport: no broker answers: %w", err)
	}
	return nil
}

// errHeldBack is reported for a message not sent because an earlier message of its
// key in the same batch was refused.
var errHeldBack = errors.New("kafkatransport: not sent: an earlier message of its key in the batch failed")

func keyOf(env *driver.Envelope) string { return env.Topic + "\x00" + string(env.Key) }

// wireSize bounds the bytes the envelope's record takes in a record batch, with the
// headers the transport may stamp.
func wireSize(env *driver.Envelope) int {
	n := recordFraming + len(env.Key) + len(env.Payload)
	for _, h := range env.Headers {
		n += headerFraming + len(h.Key) + len(h.Value)
	}
	return n + stampedHeaders
}

// check refuses, before anything is sent, what the client or broker could never
// accept. Refusing here rather than in the client keeps the refusal to this one
// message: the client would go on producing the key's later messages.
func (t *Transport) check(env *driver.Envelope) error {
	if err := transportkit.CheckSize("kafkatransport", env, t.cfg.MaxMessageSize); err != nil {
		return err
	}
	if size := wireSize(env); size > t.recordLimit {
		return driver.Permanent(fmt.Errorf("%w: kafkatransport: message with %d headers takes up to %d bytes as a record, more than the %d the client's batches carry (kgo.ProducerBatchMaxBytes); Config.MaxMessageSize leaves room for the framing of %d headers", outbox.ErrTooLarge, len(env.Headers), size, t.recordLimit, coveredHeaders))
	}
	if env.Partition != nil && !t.explicitPartitions {
		return driver.Permanent(fmt.Errorf("%w: kafkatransport: message names partition %d but the client's partitioner ignores explicit partitions: build the client with kgo.RecordPartitioner(kafkatransport.Partitioner(nil))", outbox.ErrMisconfigured, *env.Partition))
	}
	return nil
}

// headers returns the application's headers followed by the message id and, when
// the application set none, the idempotency key. The envelope's own slice is never
// appended to.
func (t *Transport) headers(env *driver.Envelope) []kgo.RecordHeader {
	id := []byte(env.ID.String())
	hs := make([]kgo.RecordHeader, 0, len(env.Headers)+2)
	for _, h := range env.Headers {
		hs = append(hs, kgo.RecordHeader{Key: h.Key, Value: h.Value})
	}
	if v, ok := env.Header(outbox.HeaderMessageID); !ok || string(v) != string(id) {
		hs = append(hs, kgo.RecordHeader{Key: outbox.HeaderMessageID, Value: id})
	}
	if !t.cfg.OmitIdempotencyKey {
		if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
			hs = append(hs, kgo.RecordHeader{Key: outbox.HeaderIdempotencyKey, Value: id})
		}
	}
	return hs
}

// permanentCodes are broker answers that retrying the same record cannot change.
var permanentCodes = []*kerr.Error{
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
	kerr.ClusterAuthorizationFailed,
	kerr.TransactionalIDAuthorizationFailed,
	kerr.InvalidRecord,
	kerr.PolicyViolation,
	kerr.UnsupportedForMessageFormat,
	kerr.InvalidRequiredAcks,
}

// classify turns one record's failure into the error reported for its envelope: the
// one place broker and client errors are translated, but for refusals as too large,
// which produce sorts out (publish.go).
func (t *Transport) classify(env *driver.Envelope, m *recordMeta, err error) error {
	wrapped := fmt.Errorf("kafkatransport: produce to %q: %w", env.Topic, err)
	switch {
	case m != nil && m.missing.Load():
		return driver.Permanent(fmt.Errorf("%w: kafkatransport: topic %q has no partition %d: %w", outbox.ErrInvalidMessage, env.Topic, m.explicit, err))
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		// The topic went away after the look-up, or the look-up had no answer.
		return t.unknownTopic(env.Topic, err)
	}
	for _, code := range permanentCodes {
		if errors.Is(err, code) {
			return driver.Permanent(wrapped)
		}
	}
	return wrapped
}
