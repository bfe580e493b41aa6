package sqstransport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// ReceiveAPI is the part of *sqs.Client a [Source] uses.
type ReceiveAPI interface {
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
}

var _ ReceiveAPI = (*sqs.Client)(nil)

// DefaultReceiveWait is the default of [SourceConfig.WaitTime].
const DefaultReceiveWait = 20 * time.Second

// SourceConfig configures a [Source].
type SourceConfig struct {
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
}

// Validate reports the first invalid field, naming it, with an error wrapping
// [outbox.ErrMisconfigured].
func (c SourceConfig) Validate() error {
	return cmp.Or(
		transportkit.Required("sqstransport", "SourceConfig.QueueURL", c.QueueURL, ""),
		transportkit.Between("sqstransport", "SourceConfig.MaxMessages", c.MaxMessages, 0, 10, "SQS returns 1 to 10 messages a receive (or 0 for 10)"),
		transportkit.Between("sqstransport", "SourceConfig.WaitTime", c.WaitTime, 0, 20*time.Second, "SQS long-polls for 0 to 20 s"),
		transportkit.Between("sqstransport", "SourceConfig.VisibilityTimeout", c.VisibilityTimeout, 0, 12*time.Hour, "SQS takes 0 to 12 h (or 0 for the queue's own)"),
	)
}

// Source is SQS's side of an [inbox.Consumer]. The messages of one FIFO message
// group in a receive are a lane, processed one at a time in the order received;
// groups, and the messages of a standard queue (each its own lane), are processed
// concurrently, and the next receive starts when every message of the last one is
// done. What is SQS's own:
//
//   - A failed message is not retried in place: it stays on the queue and comes back
//     after its visibility timeout, and the later messages of its group in the same
//     receive are not processed (nor deleted): they come back behind it.
//   - A message is deleted after its unit committed, with the others of its receive
//     in one DeleteMessageBatch (ten to a request). A crash or a failed delete leaves
//     it on the queue; it is received again and the inbox finds its key.
//   - A message that cannot be decoded or has no inbox key is left on the queue, and
//     so are the later messages of its group in the receive: give the queue a
//     redrive policy so such messages reach a dead-letter queue.
//   - The source does not extend visibility timeouts: size the queue's (or
//     VisibilityTimeout) above the longest processing time.
//   - A [inbox.Delivery]'s Raw is the types.Message (its receipt handle and system
//     attributes); its Topic is empty; Redelivered says the queue delivered it
//     before (ApproximateReceiveCount above 1).
type Source struct {
	client ReceiveAPI
	cfg    SourceConfig
}

// NewSource returns a source on client. It fails with an error wrapping
// [outbox.ErrMisconfigured] when client is missing or cfg is invalid.
func NewSource(client ReceiveAPI, cfg SourceConfig) (*Source, error) {
	if err := transportkit.CheckArgs(client == nil, "sqstransport: NewSource needs an SQS client", cfg); err != nil {
		return nil, err
	}
	cfg.MaxMessages = cmp.Or(cfg.MaxMessages, 10)
	cfg.WaitTime = cmp.Or(cfg.WaitTime, DefaultReceiveWait)
	return &Source{client: client, cfg: cfg}, nil
}

var (
	attrGroup    = types.MessageSystemAttributeNameMessageGroupId
	attrReceives = types.MessageSystemAttributeNameApproximateReceiveCount
)

// Receive receives once and returns each FIFO group's messages, or each message of a
// standard queue, as a lane.
func (s *Source) Receive(ctx context.Context) ([][]*inbox.Delivery, error) {
	in := &sqs.ReceiveMessageInput{
		QueueUrl:                    aws.String(s.cfg.QueueURL),
		MaxNumberOfMessages:         s.cfg.MaxMessages,
		WaitTimeSeconds:             int32(s.cfg.WaitTime / time.Second),
		MessageAttributeNames:       []string{"All"},
		MessageSystemAttributeNames: []types.MessageSystemAttributeName{attrGroup, attrReceives},
		// Some servers read system attributes only from the deprecated field.
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeName(attrGroup), types.QueueAttributeName(attrReceives)}, //lint:ignore SA1019 emulators need it
	}
	if s.cfg.VisibilityTimeout > 0 {
		in.VisibilityTimeout = int32((s.cfg.VisibilityTimeout + time.Second - 1) / time.Second)
	}
	out, err := s.client.ReceiveMessage(ctx, in)
	if err != nil {
		return nil, fmt.Errorf("sqstransport: receive from %s: %w", s.cfg.QueueURL, err)
	}
	var lanes [][]*inbox.Delivery
	index := map[string]int{}
	for i, m := range out.Messages {
		g, ok := m.Attributes[string(attrGroup)]
		if !ok || g == "" {
			// Standard queue: every message on its own.
			g = "\x00" + strconv.Itoa(i)
		}
		j, ok := index[g]
		if !ok {
			j = len(lanes)
			index[g] = j
			lanes = append(lanes, nil)
		}
		lanes[j] = append(lanes[j], delivery(m))
	}
	return lanes, nil
}

func delivery(m types.Message) *inbox.Delivery {
	d, err := Decode(m)
	if err != nil {
		return inbox.Undecodable(m, fmt.Errorf("message %s: %w", aws.ToString(m.MessageId), err))
	}
	receives, _ := strconv.Atoi(m.Attributes[string(attrReceives)])
	return &inbox.Delivery{
		ID:          d.ID,
		Message:     outbox.Message{Key: d.Key, Payload: d.Payload, Headers: d.Headers},
		Redelivered: receives > 1,
		Raw:         m,
	}
}

// Ack deletes the messages, ten to a request.
func (s *Source) Ack(ctx context.Context, ds []*inbox.Delivery) error {
	var errs []error
	for len(ds) > 0 {
		n := min(len(ds), 10)
		entries := make([]types.DeleteMessageBatchRequestEntry, n)
		for i, d := range ds[:n] {
			entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: d.Raw.(types.Message).ReceiptHandle}
		}
		ds = ds[n:]
		out, err := s.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(s.cfg.QueueURL), Entries: entries})
		if err == nil && len(out.Failed) > 0 {
			err = errors.New(aws.ToString(out.Failed[0].Message))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sqstransport: delete of %d messages from %s: %w", n, s.cfg.QueueURL, err))
		}
	}
	return errors.Join(errs...)
}

// Why a message is not settled here: the queue delivers it again.
var (
	errLeft          = errors.New("sqstransport: left on the queue, for its redrive policy to move to a dead-letter queue")
	errNotExtendable = errors.New("sqstransport: left on the queue, to be received again after its visibility timeout")
)

// Reject leaves the message on the queue, for its redrive policy, and stops its
// group's lane.
func (s *Source) Reject(context.Context, *inbox.Delivery, error) error { return errLeft }

// Extend leaves a failed message to the queue's redelivery instead of a retry in
// place, and stops its group's lane: the source does not extend visibility.
func (s *Source) Extend(context.Context, *inbox.Delivery) error { return errNotExtendable }
