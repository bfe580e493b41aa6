package sqstransport

import (
	"context"
	"fmt"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
)

// Resolver maps a message's topic to the URL of the queue it is sent to.
type Resolver interface {
	// QueueURL returns the queue URL for topic. Errors marked [driver.Permanent] park
	// the topic's messages; any other error is retried.
	QueueURL(ctx context.Context, topic string) (string, error)
}

// Queues is a static Resolver: topic → queue URL. A topic it does not list is a
// permanent failure wrapping [middleware.ErrNoRoute].
type Queues map[string]string

// QueueURL implements [Resolver].
func (q Queues) QueueURL(_ context.Context, topic string) (string, error) {
	if url, ok := q[topic]; ok {
		return url, nil
	}
	return "", driver.Permanent(fmt.Errorf("sqstransport: topic %q has no queue URL in the static map: %w", topic, middleware.ErrNoRoute))
}

// GetQueueURLAPI is the SDK method [NameResolver] calls.
type GetQueueURLAPI interface {
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, opts ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
}

// NameResolver treats the topic as a queue name and looks its URL up with
// GetQueueUrl, once per topic: answers are cached for the resolver's life (a queue's
// URL never changes). Failed look-ups are not cached. A queue that does not exist is
// a permanent failure.
type NameResolver struct {
	client GetQueueURLAPI
	owner  string

	mu   sync.Mutex
	urls map[string]string
}

// NewNameResolver returns a NameResolver. ownerAccountID, when not empty, looks the
// queues up in that AWS account (GetQueueUrl's QueueOwnerAWSAccountId).
func NewNameResolver(client GetQueueURLAPI, ownerAccountID string) *NameResolver {
	return &NameResolver{client: client, owner: ownerAccountID, urls: make(map[string]string)}
}

// QueueURL implements [Resolver].
func (r *NameResolver) QueueURL(ctx context.Context, topic string) (string, error) {
	r.mu.Lock()
	url, ok := r.urls[topic]
	r.mu.Unlock()
	if ok {
		return url, nil
	}
	if !validQueueName(topic) {
		return "", driver.Permanent(fmt.Errorf("sqstransport: topic %q is not a valid queue name (1 to 80 of A-Z a-z 0-9 - _, optionally ending in .fifo): %w", topic, middleware.ErrNoRoute))
	}
	in := &sqs.GetQueueUrlInput{QueueName: aws.String(topic)}
	if r.owner != "" {
		in.QueueOwnerAWSAccountId = aws.String(r.owner)
	}
	out, err := r.client.GetQueueUrl(ctx, in)
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return "", ctxErr
		}
		return "", classify(fmt.Errorf("sqstransport: look up queue %q: %w", topic, err))
	}
	if out.QueueUrl == nil || *out.QueueUrl == "" {
		return "", fmt.Errorf("sqstransport: look up queue %q: empty queue URL in the answer", topic)
	}
	r.mu.Lock()
	r.urls[topic] = *out.QueueUrl
	r.mu.Unlock()
	return *out.QueueUrl, nil
}

func validQueueName(name string) bool {
	base := name
	if len(base) > len(fifoSuffix) && base[len(base)-len(fifoSuffix):] == fifoSuffix {
		base = base[:len(base)-len(fifoSuffix)]
	}
	if base == "" || len(base) > 80 {
		return false
	}
	for i := 0; i < len(base); i++ {
		c := base[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
