package sqstransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
)

// ReceiveAPI is the part of *sqs.Client a [Receiver] uses.
type ReceiveAPI interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
}

var _ ReceiveAPI = (*sqs.Client)(nil)

// ReceiveHandler applies the effects of one received message. It runs inside the
// inbox's unit of work: write with ctx through the store's accessors and send with
// ctx, and everything commits with the message's inbox key. Return an error to roll
// back; the message is then left on the queue, to be received again after its
// visibility timeout.
type ReceiveHandler func(ctx context.Context, d *Delivery) error

// Defaults of [ReceiverConfig].
const (
	DefaultReceiveWait        = 20 * time.Second
	DefaultReceiveStopTimeout = 30 * time.Second
)

// ReceiverConfig configures a [Receiver].
type ReceiverConfig struct {
	// QueueURL is the queue to receive from. Required.
	QueueURL string
	// MaxMessages is how many messages one receive asks for, 1 to 10. Defaults to 10.
	MaxMessages int32
	// WaitTime is the long-poll wait of a receive, at most 20 s. Defaults to
	// DefaultReceiveWait (20 s).
	WaitTime time.Duration
	// VisibilityTimeout, if set, overrides the queue's for the messages received: how
	// long a message stays hidden from other receivers while it is processed. A
	// message whose processing takes longer is received again elsewhere (and found a
	// duplicate if its unit committed). Defaults to 0: the queue's own.
	VisibilityTimeout time.Duration
	// StopTimeout bounds how long [Receiver.Run], once its ctx is done, lets the
	// messages in progress finish and be deleted; then their ctx is cancelled too.
	// Defaults to DefaultReceiveStopTimeout (30 s).
	StopTimeout time.Duration
	// Processed, if set, is called after a message's unit of work committed (or the
	// message was found a duplicate) and before the message is deleted. Defaults to
	// nil.
	Processed func(d *Delivery, res inbox.Result)
	// Logger receives failed messages and failed deletes. Defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c ReceiverConfig) Validate() error {
	switch {
	case c.QueueURL == "":
		return fmt.Errorf("%w: sqstransport: ReceiverConfig.QueueURL is required", outbox.ErrMisconfigured)
	case c.MaxMessages < 0 || c.MaxMessages > 10:
		return fmt.Errorf("%w: sqstransport: ReceiverConfig.MaxMessages %d: SQS returns 1 to 10 messages a receive", outbox.ErrMisconfigured, c.MaxMessages)
	case c.WaitTime < 0 || c.WaitTime > 20*time.Second:
		return fmt.Errorf("%w: sqstransport: ReceiverConfig.WaitTime %v: SQS long-polls for 0 to 20 s", outbox.ErrMisconfigured, c.WaitTime)
	case c.VisibilityTimeout < 0 || c.VisibilityTimeout > 12*time.Hour:
		return fmt.Errorf("%w: sqstransport: ReceiverConfig.VisibilityTimeout %v: SQS takes 0 to 12 h", outbox.ErrMisconfigured, c.VisibilityTimeout)
	case c.StopTimeout < 0:
		return fmt.Errorf("%w: sqstransport: ReceiverConfig.StopTimeout %v is negative", outbox.ErrMisconfigured, c.StopTimeout)
	}
	return nil
}

func (c ReceiverConfig) withDefaults() ReceiverConfig {
	if c.MaxMessages == 0 {
		c.MaxMessages = 10
	}
	if c.WaitTime == 0 {
		c.WaitTime = DefaultReceiveWait
	}
	if c.StopTimeout == 0 {
		c.StopTimeout = DefaultReceiveStopTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Receiver is a receive loop that applies each message's effects once through an
// [inbox.Inbox]: every message is processed in the inbox's unit of work, and deleted
// from the queue only after that unit committed.
//
// # Semantics
//
//   - Messages of one FIFO message group are processed one at a time, in the order
//     received; groups, and the messages of a standard queue, are processed
//     concurrently. When a message of a group fails, the later messages of its group
//     in the same receive are not processed (nor deleted): they come back after their
//     visibility timeout, behind it.
//   - A message is deleted after its unit committed, with the others of its receive
//     in one DeleteMessageBatch. A crash or a failed delete leaves it on the queue; it
//     is received again and the inbox finds its key: its effects are applied once
//     (within the inbox's retention).
//   - A message that cannot be decoded or has no inbox key is left on the queue and
//     logged at ERROR: give the queue a redrive policy so such messages reach a
//     dead-letter queue.
//   - [Receiver.Run] returns when its ctx is done: it receives no more, lets the
//     messages in progress finish (within StopTimeout), deletes them and returns
//     nil. No goroutine outlives it.
//
// # Limitations
//
//   - The next receive starts when every message of the last one is done, so one
//     slow message holds the others back; run several Receivers for parallelism.
//   - The receiver does not extend visibility timeouts: size the queue's (or
//     VisibilityTimeout) above the longest processing time.
type Receiver struct {
	client ReceiveAPI
	in     *inbox.Inbox
	handle ReceiveHandler
	cfg    ReceiverConfig
}

// NewReceiver returns a receive loop on client. It fails with an error wrapping
// [outbox.ErrMisconfigured] when an argument is missing or cfg is invalid.
func NewReceiver(client ReceiveAPI, in *inbox.Inbox, handle ReceiveHandler, cfg ReceiverConfig) (*Receiver, error) {
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: sqstransport: NewReceiver needs an SQS client", outbox.ErrMisconfigured)
	case in == nil:
		return nil, fmt.Errorf("%w: sqstransport: NewReceiver needs an *inbox.Inbox (inbox.New on the store the handler writes to)", outbox.ErrMisconfigured)
	case handle == nil:
		return nil, fmt.Errorf("%w: sqstransport: NewReceiver needs a ReceiveHandler", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Receiver{client: client, in: in, handle: handle, cfg: cfg.withDefaults()}, nil
}

// Run receives until ctx is done, then stops gracefully (see [Receiver]) and returns
// nil. A failed receive is logged and retried after a pause.
func (r *Receiver) Run(ctx context.Context) error {
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(r.cfg.StopTimeout, cancelWork)
		context.AfterFunc(work, func() { t.Stop() })
	})
	defer stop()
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		in := &sqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(r.cfg.QueueURL),
			MaxNumberOfMessages:         r.cfg.MaxMessages,
			WaitTimeSeconds:             int32(r.cfg.WaitTime / time.Second),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameMessageGroupId},
			// Some servers read system attributes only from the deprecated field.
			AttributeNames: []types.QueueAttributeName{types.QueueAttributeName(types.MessageSystemAttributeNameMessageGroupId)}, //lint:ignore SA1019 emulators need it
		}
		if r.cfg.VisibilityTimeout > 0 {
			in.VisibilityTimeout = int32((r.cfg.VisibilityTimeout + time.Second - 1) / time.Second)
		}
		out, err := r.client.ReceiveMessage(ctx, in)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.cfg.Logger.WarnContext(ctx, "sqstransport: receiver: receive failed; retrying", "queue", r.cfg.QueueURL, "error", err)
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			pause = min(2*pause, 10*time.Second)
			continue
		}
		pause = 100 * time.Millisecond
		r.process(ctx, work, out.Messages)
	}
	return nil
}

// process handles one receive: each group in its own goroutine, then one delete of
// everything done.
func (r *Receiver) process(ctx, work context.Context, msgs []types.Message) {
	if len(msgs) == 0 {
		return
	}
	var groups [][]types.Message
	index := map[string]int{}
	for i, m := range msgs {
		g, ok := m.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if !ok || g == "" {
			// Standard queue: every message on its own.
			g = "\x00" + strconv.Itoa(i)
		}
		j, ok := index[g]
		if !ok {
			j = len(groups)
			index[g] = j
			groups = append(groups, nil)
		}
		groups[j] = append(groups[j], m)
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		done []types.Message
	)
	for _, group := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, m := range group {
				if ctx.Err() != nil || !r.processMessage(ctx, work, m) {
					return
				}
				mu.Lock()
				done = append(done, m)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.delete(ctx, work, done)
}

// processMessage runs one message through the inbox once; it reports whether its
// unit committed (or it was a duplicate).
func (r *Receiver) processMessage(ctx, work context.Context, m types.Message) bool {
	d, err := Decode(m)
	if err != nil {
		r.cfg.Logger.ErrorContext(ctx, "sqstransport: receiver: leaving a message that cannot be decoded on the queue", "queue", r.cfg.QueueURL, "message", aws.ToString(m.MessageId), "error", err)
		return false
	}
	msg := &outbox.Message{Key: d.Key, Payload: d.Payload, Headers: d.Headers}
	if _, err := r.in.Key(msg); err != nil {
		r.cfg.Logger.ErrorContext(ctx, "sqstransport: receiver: leaving a message that has no inbox key on the queue", "queue", r.cfg.QueueURL, "message", aws.ToString(m.MessageId), "error", err)
		return false
	}
	res, err := r.in.Process(work, msg, func(ctx context.Context) error { return r.handle(ctx, d) })
	if err != nil {
		if work.Err() == nil {
			r.cfg.Logger.WarnContext(ctx, "sqstransport: receiver: message failed; it will be received again", "queue", r.cfg.QueueURL, "message", aws.ToString(m.MessageId), "error", err)
		}
		return false
	}
	if r.cfg.Processed != nil {
		r.cfg.Processed(d, res)
	}
	return true
}

// delete removes the processed messages, ten to a request.
func (r *Receiver) delete(ctx, work context.Context, msgs []types.Message) {
	for len(msgs) > 0 {
		n := min(len(msgs), 10)
		entries := make([]types.DeleteMessageBatchRequestEntry, n)
		for i, m := range msgs[:n] {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle}
		}
		msgs = msgs[n:]
		out, err := r.client.DeleteMessageBatch(work, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(r.cfg.QueueURL), Entries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = errors.New(aws.ToString(out.Failed[0].Message))
		}
		if err != nil {
			r.cfg.Logger.WarnContext(ctx, "sqstransport: receiver: delete failed; the messages will be received again and skipped as duplicates", "queue", r.cfg.QueueURL, "messages", n, "error", err)
		}
	}
}
