package dynamostore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Client is the part of the DynamoDB API the store calls. *dynamodb.Client from
// github.com/aws/aws-sdk-go-v2/service/dynamodb implements it; wrap one to add
// instrumentation or fault injection.
type Client interface {
	Query(ctx context.Context, in *ddb.QueryInput, optFns ...func(*ddb.Options)) (*ddb.QueryOutput, error)
	UpdateItem(ctx context.Context, in *ddb.UpdateItemInput, optFns ...func(*ddb.Options)) (*ddb.UpdateItemOutput, error)
	PutItem(ctx context.Context, in *ddb.PutItemInput, optFns ...func(*ddb.Options)) (*ddb.PutItemOutput, error)
	DeleteItem(ctx context.Context, in *ddb.DeleteItemInput, optFns ...func(*ddb.Options)) (*ddb.DeleteItemOutput, error)
	BatchWriteItem(ctx context.Context, in *ddb.BatchWriteItemInput, optFns ...func(*ddb.Options)) (*ddb.BatchWriteItemOutput, error)
	TransactWriteItems(ctx context.Context, in *ddb.TransactWriteItemsInput, optFns ...func(*ddb.Options)) (*ddb.TransactWriteItemsOutput, error)
}

var _ Client = (*ddb.Client)(nil)

// Store is the DynamoDB outbox store's handle. Applications send into it
// ([outbox.NewSender]), run units of work on it ([Store.Transact], with [AddItems]
// for their own writes), write messages that have no business write
// ([Store.Enqueue]), and build their own TransactWriteItems request with it
// ([Store.CreateTransactWriteItems], [Store.NotifyCommitted]). Relays, the inbox and
// the tools reach its relay side through [Store.Driver].
//
// A Store is safe for concurrent use.
type Store struct {
	client Client
	cfg    Config
	keys   keys
	log    *slog.Logger
	hub    driver.Hub
	closed atomic.Bool

	mu sync.Mutex
	// lastRemoved holds, per bucket, the highest Seq this store removed since it took
	// the bucket's lease (0: none yet). Gap probing starts above it.
	lastRemoved []int64
	// heads holds, per bucket, what the last fetch saw of a head that waits for a due
	// time (nil: nothing known), and ahead a counter value seen above it.
	heads []*heldHead
	ahead []ahead
	// zeroUntil is the expiry of bucket zero's lease as last claimed or renewed through
	// this store (zero: not held), for SampleBacklog.
	zeroUntil time.Time
	// beats holds, per relay id, the latest time a heartbeat sent through this store
	// carried, whether or not it landed: StopRelay dates the record no earlier, so no
	// heartbeat of the stopped run can land later and clear the stop stamp.
	beats map[string]time.Time
	// reported holds the sort keys of malformed coordination items already logged.
	reported map[string]bool
	// unreadable holds the buckets whose lease item the last ReadCoordination could
	// not read, for Claim.
	unreadable map[int]bool
}

// driverStore is the store's relay side: a [driver.Store] that also implements
// [driver.Admin], [driver.Notifier], [driver.Prober], [driver.BacklogSampler] and
// the inbox's key store. Its methods reach the Store's fields and helpers through
// the embedded handle.
type driverStore struct{ *Store }

var (
	_ driver.Handle         = (*Store)(nil)
	_ driver.SizeLimiter    = (*Store)(nil)
	_ driver.Store          = driverStore{}
	_ driver.Admin          = driverStore{}
	_ driver.Notifier       = driverStore{}
	_ driver.Prober         = driverStore{}
	_ driver.BacklogSampler = driverStore{}
)

// Driver returns the store's relay side, for relays, the inbox, the stream handler
// (package dynamostreams) and tools; applications do not call it. Besides
// [driver.Store] it implements [driver.Admin], [driver.Notifier], [driver.Prober] and
// [driver.BacklogSampler].
func (s *Store) Driver() driver.Store { return driverStore{s} }

// New returns a store on the table cfg names, through client, which the caller built
// and keeps: Close does not close it. New makes no request; create the table with
// [CreateIfNotExists] or provision it as the package documentation shows (a relay
// starting on a missing table fails with [outbox.ErrMisconfigured]).
func New(client Client, cfg Config) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: dynamostore: New needs a client", outbox.ErrMisconfigured)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Store{
		client:      client,
		cfg:         cfg,
		keys:        keys{prefix: cfg.KeyPrefix, pk: cfg.PartitionKeyAttributeName, sk: cfg.SortKeyAttributeName},
		log:         cfg.Logger,
		lastRemoved: make([]int64, cfg.BucketCount),
		heads:       make([]*heldHead, cfg.BucketCount),
		ahead:       make([]ahead, cfg.BucketCount),
		beats:       map[string]time.Time{},
		reported:    map[string]bool{},
	}, nil
}

// BucketCount returns the configured bucket count.
func (s driverStore) BucketCount() int { return s.cfg.BucketCount }

// Config returns the options in effect, defaults filled in.
func (s *Store) Config() Config { return s.cfg }

// MaxMessageSize is the largest [outbox.Message.Size] that fits in one item:
// DynamoDB's 400 KB item limit less room for the item's keys (KeyPrefix included) and
// bookkeeping attributes, and less the room Reschedule and Park need later (attempts,
// next attempt, up to 2 KB of error text, parking time), so that a message at the
// limit can still fail safely. Writes still measure the exact item and refuse, with
// [outbox.ErrTooLarge], one that does not leave that room (a message with very many
// small headers, whose encoding takes more than its Size counts).
func (s *Store) MaxMessageSize() int {
	return maxWrittenItem - itemOverhead - len(s.cfg.KeyPrefix) - len(s.cfg.PartitionKeyAttributeName) - len(s.cfg.SortKeyAttributeName)
}

// Subscribe returns a channel of buckets this process committed to; see
// [driver.Notifier]. Commits by other processes are not announced: their relays find
// them by polling.
func (s driverStore) Subscribe(ctx context.Context) <-chan int { return s.hub.Subscribe(ctx) }

// Check reports whether a relay can work on the table, with one eventually
// consistent Query of one key of the coordination partition (the read every relay
// is allowed): a missing table fails with an error wrapping
// [outbox.ErrMisconfigured] that says to create it with [CreateIfNotExists] (or to
// fix Config.TableName); any other failure is returned wrapped. A relay calls it
// when it starts.
func (s driverStore) Check(ctx context.Context) error {
	if err := s.enter(ctx); err != nil {
		return err
	}
	_, err := s.client.Query(ctx, &ddb.QueryInput{
		TableName:                 aws.String(s.cfg.TableName),
		KeyConditionExpression:    aws.String("#pk = :pk"),
		ExpressionAttributeNames:  map[string]string{"#pk": s.keys.pk, "#sk": s.keys.sk},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: s.keys.coordination()}},
		ProjectionExpression:      aws.String("#sk"),
		Limit:                     aws.Int32(1),
	})
	return s.translate(ctx, "check the table", err)
}

// Close refuses every later call with [outbox.ErrClosed] and closes every
// subscription. It does not close the client. Closing twice is a no-op.
func (s *Store) Close() error {
	s.closed.Store(true)
	s.hub.Close()
	return nil
}

// As reaches the client: target must be a *Client, or a **dynamodb.Client when the
// store was built on one.
func (s *Store) As(target any) bool {
	switch t := target.(type) {
	case *Client:
		*t = s.client
		return true
	case **ddb.Client:
		c, ok := s.client.(*ddb.Client)
		if ok {
			*t = c
		}
		return ok
	}
	return false
}

var errClosed = fmt.Errorf("dynamostore: %w", outbox.ErrClosed)

// enter checks ctx and that the store is open.
func (s *Store) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return errClosed
	}
	return nil
}

func (s *Store) checkBucket(bucket int) error {
	if bucket < 0 || bucket >= s.cfg.BucketCount {
		return fmt.Errorf("%w: dynamostore: bucket %d outside 0..%d", outbox.ErrMisconfigured, bucket, s.cfg.BucketCount-1)
	}
	return nil
}

// translate is the one place DynamoDB errors become the store's errors: a done
// context's error unwrapped, a missing table as a misconfiguration, anything else
// wrapped with the operation's name.
func (s *Store) translate(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if errors.Is(err, context.Canceled) {
			return context.Canceled
		}
		return context.DeadlineExceeded
	}
	if _, ok := errors.AsType[*types.ResourceNotFoundException](err); ok {
		return fmt.Errorf("%w: dynamostore: %s: table %q not found: create it with dynamostore.CreateIfNotExists (or provision it from dynamostore.CreateTableInput), or fix Config.TableName: %w",
			outbox.ErrMisconfigured, op, s.cfg.TableName, err)
	}
	return fmt.Errorf("dynamostore: %s: %w", op, err)
}

func isConditionFailed(err error) bool {
	_, ok := errors.AsType[*types.ConditionalCheckFailedException](err)
	return ok
}

// forEach runs fn for 0..n-1 with at most MaxConcurrency calls in flight and returns
// the first error; the context fn gets is cancelled once one call failed.
func (s *Store) forEach(ctx context.Context, n int, fn func(ctx context.Context, i int) error) error {
	if n == 1 {
		return fn(ctx, 0)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	sem := make(chan struct{}, s.cfg.MaxConcurrency)
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, i); err != nil {
				once.Do(func() {
					firstErr = err
					cancel()
				})
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}
