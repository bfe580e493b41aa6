package sqstransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

const (
	// DefaultQueueLimit is the default [Config.QueueLimit]: 256 KiB, what emulators
	// and older accounts allow.
	DefaultQueueLimit = 256 * 1024
	// MaxQueueLimit is the largest [Config.QueueLimit], the most SQS supports: 1 MiB.
	MaxQueueLimit = 1024 * 1024
	// MinQueueLimit is the smallest [Config.QueueLimit]: what the transport reserves
	// for its own attributes and the framing of headers leaves at least 1 KiB for the
	// message.
	MinQueueLimit = 4096
	// DefaultConcurrency is the default number of SendMessageBatch requests in flight
	// at once for one Publish call.
	DefaultConcurrency = 8
	// maxEntries is SQS's limit of entries in one SendMessageBatch request.
	maxEntries = 10
	fifoSuffix = ".fifo"
)

// API is the part of the SQS client the transport uses. A *sqs.Client satisfies it;
// so does a wrapper that adds tracing or fault injection around one.
type API interface {
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	GetQueueURLAPI
}

// Config configures a [Transport]. The zero value is usable.
type Config struct {
	// Resolver maps topics to queue URLs. Defaults to a [NameResolver] on the client:
	// the topic is the queue name, looked up once with GetQueueUrl and cached.
	Resolver Resolver
	// QueueLimit is the queues' MaximumMessageSize: the most bytes SQS takes for one
	// message, and for the sum of the messages in one SendMessageBatch request, as
	// SQS counts them (body plus every attribute's name, type and value). Keep it at
	// or under the queues' setting. Defaults to [DefaultQueueLimit] (256 KiB); at
	// least [MinQueueLimit], at most [MaxQueueLimit] (1 MiB, what SQS allows).
	QueueLimit int
	// MaxMessageSize is the largest [outbox.Message.Size] (of the message as
	// captured) the transport publishes; [Transport.MaxMessageSize] reports it. A
	// larger message fails permanently, wrapping [outbox.ErrTooLarge], without being
	// sent; capture refuses it at Send when the transport is wired in through
	// outbox.SenderConfig.Transport. Defaults to the most that QueueLimit can always
	// carry, and may not exceed it: three quarters (for base64) of what QueueLimit
	// leaves after a reserve of 2,545 bytes (2,472 with OmitIdempotencyKey) for the
	// attributes the transport adds and the framing of 32 headers, which is 194,698
	// bytes for the default 256 KiB and 784,522 for 1 MiB.
	MaxMessageSize int
	// Concurrency caps the SendMessageBatch requests one Publish has in flight.
	// Requests to one FIFO queue are always sent one after another, to keep group
	// order. Defaults to [DefaultConcurrency].
	Concurrency int
	// OmitIdempotencyKey stops the transport from adding an
	// [outbox.HeaderIdempotencyKey] header (equal to the message ID) to messages whose
	// application set none. It is the only switch for that header: capture never adds
	// it. Defaults to false: every message carries one.
	OmitIdempotencyKey bool
	// Logger receives debug records of failed requests. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults(client API) {
	if c.Resolver == nil {
		c.Resolver = NewNameResolver(client, "")
	}
	if c.QueueLimit == 0 {
		c.QueueLimit = DefaultQueueLimit
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = limitFor(c.QueueLimit, !c.OmitIdempotencyKey)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate reports the first setting that cannot work, naming its field. Zero values
// are valid: they take their defaults.
func (c Config) Validate() error {
	if c.QueueLimit != 0 && (c.QueueLimit < MinQueueLimit || c.QueueLimit > MaxQueueLimit) {
		return fmt.Errorf("%w: sqstransport: Config.QueueLimit is %d; it must be between %d and %d (or 0 for the default %d)", outbox.ErrMisconfigured, c.QueueLimit, MinQueueLimit, MaxQueueLimit, DefaultQueueLimit)
	}
	if err := transportkit.Positive("sqstransport", "Config.MaxMessageSize", c.MaxMessageSize, "the default"); err != nil {
		return err
	}
	queueLimit := c.QueueLimit
	if queueLimit == 0 {
		queueLimit = DefaultQueueLimit
	}
	if capacity := limitFor(queueLimit, !c.OmitIdempotencyKey); c.MaxMessageSize > capacity {
		if need := queueLimitFor(c.MaxMessageSize, !c.OmitIdempotencyKey); need <= MaxQueueLimit {
			return fmt.Errorf("%w: sqstransport: Config.MaxMessageSize %d exceeds the %d that Config.QueueLimit %d always carries: raise QueueLimit (and the queues' MaximumMessageSize) to at least %d, or lower MaxMessageSize", outbox.ErrMisconfigured, c.MaxMessageSize, capacity, queueLimit, need)
		}
		return fmt.Errorf("%w: sqstransport: Config.MaxMessageSize %d exceeds the %d that Config.QueueLimit %d always carries, and SQS allows at most %d (a MaxMessageSize of %d)", outbox.ErrMisconfigured, c.MaxMessageSize, capacity, queueLimit, MaxQueueLimit, limitFor(MaxQueueLimit, !c.OmitIdempotencyKey))
	}
	if c.Concurrency < 0 {
		return fmt.Errorf("%w: sqstransport: Config.Concurrency is %d; it must be at least 1 (or 0 for the default %d)", outbox.ErrMisconfigured, c.Concurrency, DefaultConcurrency)
	}
	return nil
}

// Transport publishes envelopes to SQS queues. It is safe for concurrent use.
type Transport struct {
	client API
	cfg    Config
}

// New returns a Transport sending through client, which the caller built and
// configured (region, credentials, endpoint, retries). New never dials. It returns an
// error wrapping [outbox.ErrMisconfigured] when client is nil or cfg is invalid
// ([Config.Validate]).
func New(client API, cfg Config) (*Transport, error) {
	if err := transportkit.CheckArgs(client == nil, "sqstransport: New needs a client: pass sqs.NewFromConfig(awsCfg)", cfg); err != nil {
		return nil, err
	}
	cfg.setDefaults(client)
	return &Transport{client: client, cfg: cfg}, nil
}

// MaxMessageSize implements [driver.SizeLimiter]: [Config.MaxMessageSize], or its
// default. Any message within it that has at most 32 headers fits [Config.QueueLimit]
// as SQS counts it, even when its payload is binary and travels as base64 (4 bytes
// for every 3), after the transport added its attributes: the message ID, the
// idempotency key (unless [Config.OmitIdempotencyKey]), the key, the layout and the
// packed headers.
//
// Publish refuses a larger message permanently, wrapping [outbox.ErrTooLarge], without
// sending it. Capture refuses it at Send, before anything is written, when the
// transport is wired in: outbox.NewSender(store, outbox.SenderConfig{Transport: t}).
func (t *Transport) MaxMessageSize() int { return t.cfg.MaxMessageSize }

// As gives access to the client: target may be a **sqs.Client (when the transport was
// built on one) or a *API. It reports whether target was set.
func (t *Transport) As(target any) bool {
	switch p := target.(type) {
	case **sqs.Client:
		c, ok := t.client.(*sqs.Client)
		if ok {
			*p = c
		}
		return ok
	case *API:
		*p = t.client
		return true
	}
	return false
}

// pending is one envelope on its way to a queue.
type pending struct {
	index int // position in the batch
	env   *driver.Envelope
	entry types.SendMessageBatchRequestEntry
	size  int
	group string
	// keyed marks a FIFO message with a key: its group's order matters to the
	// relay, so its later messages never share its request and are held back
	// when it fails.
	keyed bool
}

// queueJob is every pending message of one queue, in batch order.
type queueJob struct {
	url     string
	fifo    bool
	entries []*pending
}

// Publish implements [driver.Transport]. It sends the batch with SendMessageBatch
// requests of at most ten entries and [Config.QueueLimit] bytes, to every queue at once
// (up to [Config.Concurrency] requests), and waits for all of them. Messages that SQS
// did not acknowledge are returned in an [*driver.PublishError], each failure marked
// permanent or transient. If ctx ends before SQS acknowledged anything, Publish
// returns ctx.Err().
func (t *Transport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	return transportkit.Publish(ctx, batch, t.publish)
}

// publish sends batch for [transportkit.Publish], recording in failures why each
// envelope failed.
func (t *Transport) publish(ctx context.Context, batch []*driver.Envelope, failures []error) error {
	acked := make([]bool, len(batch))

	urls := make(map[string]string)
	urlErrs := make(map[string]error)
	jobs := make(map[string]*queueJob)
	var order []*queueJob
	for i, env := range batch {
		url, ok := urls[env.Topic]
		if !ok {
			if err, failed := urlErrs[env.Topic]; failed {
				failures[i] = err
				continue
			}
			var err error
			url, err = t.cfg.Resolver.QueueURL(ctx, env.Topic)
			if err != nil {
				if ctxErr := ctx.Err(); ctxErr != nil {
					return ctxErr // nothing was sent yet
				}
				urlErrs[env.Topic] = err
				failures[i] = err
				continue
			}
			urls[env.Topic] = url
		}
		if err := transportkit.CheckSize("sqstransport", env, t.cfg.MaxMessageSize); err != nil {
			failures[i] = err
			continue
		}
		enc, err := encode(env, t.cfg.QueueLimit, !t.cfg.OmitIdempotencyKey)
		if err != nil {
			failures[i] = driver.Permanent(err)
			continue
		}
		job := jobs[url]
		if job == nil {
			job = &queueJob{url: url, fifo: strings.HasSuffix(url, fifoSuffix)}
			jobs[url] = job
			order = append(order, job)
		}
		p := &pending{index: i, env: env, size: enc.size}
		p.entry = types.SendMessageBatchRequestEntry{
			MessageBody:       aws.String(enc.body),
			MessageAttributes: enc.attrs,
		}
		if job.fifo {
			p.group = GroupID(env)
			p.keyed = env.Key != nil
			p.entry.MessageGroupId = aws.String(p.group)
			p.entry.MessageDeduplicationId = aws.String(env.ID.String())
		}
		job.entries = append(job.entries, p)
	}

	var (
		wg  sync.WaitGroup
		sem = make(chan struct{}, t.cfg.Concurrency)
	)
	// send runs one request and records its outcome. Each index is written by one
	// request only, so no lock is needed around failures and acked.
	send := func(url string, chunk []*pending) (failed map[string]error) {
		t.sendChunk(ctx, url, chunk, failures, acked)
		for _, p := range chunk {
			if !acked[p.index] && !driver.IsPermanent(failures[p.index]) && p.keyed {
				if failed == nil {
					failed = make(map[string]error)
				}
				if _, ok := failed[p.group]; !ok {
					failed[p.group] = failures[p.index]
				}
			}
		}
		return failed
	}
	for _, job := range order {
		if !job.fifo {
			chunks := split(job.entries, t.cfg.QueueLimit)
			for _, chunk := range chunks {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					send(job.url, chunk)
				}()
			}
			continue
		}
		chunks := splitFIFO(job.entries, t.cfg.QueueLimit)
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			// One request at a time: SQS orders a group only within a request and
			// across requests that follow one another. Once a message of a group
			// failed transiently, later messages of that group are held back so they
			// cannot overtake it.
			blocked := make(map[string]error)
			for _, chunk := range chunks {
				ready := chunk[:0:0]
				for _, p := range chunk {
					if cause, ok := blocked[p.group]; ok {
						failures[p.index] = fmt.Errorf("sqstransport: held back behind an earlier message of group %q that failed: %w", p.group, cause)
						continue
					}
					ready = append(ready, p)
				}
				if len(ready) == 0 {
					continue
				}
				for g, err := range send(job.url, ready) {
					blocked[g] = err
				}
			}
		}()
	}
	wg.Wait()

	anyAcked := false
	for i := range batch {
		switch {
		case acked[i]:
			anyAcked, failures[i] = true, nil
		case failures[i] == nil:
			failures[i] = errors.New("sqstransport: no result for message")
		}
	}
	if !anyAcked {
		// Every message failed: if ctx ended, nothing may be assumed sent.
		return ctx.Err()
	}
	return nil
}

// split cuts a queue's messages, in order, into requests of at most ten entries whose
// sizes add up to at most limit.
func split(entries []*pending, limit int) [][]*pending {
	var (
		chunks [][]*pending
		start  int
		bytes  int
	)
	for i, p := range entries {
		if i-start == maxEntries || (i > start && bytes+p.size > limit) {
			chunks = append(chunks, entries[start:i])
			start, bytes = i, 0
		}
		bytes += p.size
	}
	if start < len(entries) {
		chunks = append(chunks, entries[start:])
	}
	return chunks
}

// splitFIFO packs a FIFO queue's messages into requests sent one after another. A
// keyed message goes into the first request after the one holding the previous
// message of its group, so a request never carries two messages of one key: when SQS
// fails one, the later ones are still unsent and can be held back. Keyless messages
// only keep their group's order, several to a request. Each request holds at most ten
// entries and limit bytes.
func splitFIFO(entries []*pending, limit int) [][]*pending {
	var (
		chunks [][]*pending
		bytes  []int
		last   = make(map[string]int)
	)
	for _, p := range entries {
		from := 0
		if c, ok := last[p.group]; ok {
			from = c
			if p.keyed {
				from++
			}
		}
		c := from
		for ; c < len(chunks); c++ {
			if len(chunks[c]) < maxEntries && bytes[c]+p.size <= limit {
				break
			}
		}
		if c == len(chunks) {
			chunks = append(chunks, nil)
			bytes = append(bytes, 0)
		}
		chunks[c] = append(chunks[c], p)
		bytes[c] += p.size
		last[p.group] = c
	}
	return chunks
}

// sendChunk sends one SendMessageBatch request and records, per message, an
// acknowledgement or a classified failure. A message is acknowledged only when SQS
// listed its entry among the successful ones.
func (t *Transport) sendChunk(ctx context.Context, url string, chunk []*pending, failures []error, acked []bool) {
	if err := ctx.Err(); err != nil {
		for _, p := range chunk {
			failures[p.index] = err
		}
		return
	}
	entries := make([]types.SendMessageBatchRequestEntry, len(chunk))
	byID := make(map[string]*pending, len(chunk))
	for i, p := range chunk {
		id := strconv.Itoa(i)
		entries[i] = p.entry
		entries[i].Id = aws.String(id)
		byID[id] = p
	}
	out, err := t.client.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(url), Entries: entries})
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
			err = ctxErr
		} else {
			err = classify(fmt.Errorf("sqstransport: send %d messages to %s: %w", len(chunk), url, err))
		}
		t.cfg.Logger.DebugContext(ctx, "sqstransport: SendMessageBatch failed", "queue", url, "messages", len(chunk), "permanent", driver.IsPermanent(err), "error", err)
		for _, p := range chunk {
			failures[p.index] = err
		}
		return
	}
	for _, s := range out.Successful {
		if s.Id == nil {
			continue
		}
		if p, ok := byID[*s.Id]; ok {
			acked[p.index] = true
			delete(byID, *s.Id)
		}
	}
	for _, f := range out.Failed {
		if f.Id == nil {
			continue
		}
		if p, ok := byID[*f.Id]; ok {
			failures[p.index] = entryError(f)
			delete(byID, *f.Id)
		}
	}
	for id, p := range byID {
		failures[p.index] = fmt.Errorf("sqstransport: SendMessageBatch returned no result for entry %s", id)
	}
}
