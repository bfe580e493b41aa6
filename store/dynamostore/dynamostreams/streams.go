// Package dynamostreams dispatches outbox messages from DynamoDB Streams: a handler
// for the events.DynamoDBEvent that AWS Lambda delivers from the stream of the
// outbox table, so a message goes out moments after its transaction commits, with
// no relay polling. Its import path ends in store/dynamostore/dynamostreams; it is a module
// of its own so that only an application that runs it downloads and compiles
// github.com/aws/aws-lambda-go.
//
// A stream record's keys name the message item's partition and sort key, which
// hold the message's bucket and Seq (see the item schema of package dynamostore).
// For each bucket named by the event's INSERT records, the handler calls
// [github.com/outboxkit/outbox/relay.Relay.DispatchAt] with the highest Seq
// named for it: under the bucket's lease, it drains the bucket in Seq order up to and
// including that message, so per-key order holds and nothing beyond the named
// messages is published. Records of other items (counters, leases, relay records,
// parked messages, the application's items, another outbox's prefix) and MODIFY or
// REMOVE records are ignored.
//
// Wiring: enable a stream on the table with StreamViewType KEYS_ONLY, map it to a
// Lambda function with FunctionResponseTypes ReportBatchItemFailures, and in that
// function build the store, a relay on it (no worker: do not call Start) and a
// [Handler] once, at init: [New] takes the relay and the store's relay side
// (store.Driver(), which reads the stream records' keys), and [Handler.Handle] goes
// to lambda.Start. Schedule a second function that calls the relay's RunOnce every
// minute or so as the safety net: it sends what a stream invocation left (a bucket
// another relay held, a message whose publish failed and waits for its retry, a
// record lost to an expired stream). The repository's DynamoDB store guide lists the
// IAM actions and the cost per message.
//
// # Semantics
//
//   - Exactly the buckets named by INSERT records are drained, each up to the highest
//     Seq named for it; earlier pending messages of a drained bucket go first (order
//     within the bucket is by Seq). Buckets are dispatched concurrently, up to
//     Config.MaxConcurrency at once.
//   - Leases: a free bucket is claimed for the dispatch and released after it. A
//     bucket another relay holds is left to that relay: DispatchAt reads the lease
//     and returns at once, without publishing or waiting, and the bucket's records
//     count as handled. Two invocations in two execution environments (two relays)
//     do not take turns on a bucket: the one that finds it leased by the other
//     returns at once (so does the one whose claim is refused, when both claim at the
//     same moment), and the holder drains the bucket only up to the highest Seq its
//     own event named. Messages that only the other event named wait for the next
//     invocation that names their bucket, or for the sweep. A holder that is a
//     running worker publishes them on its next poll. Concurrent calls of Handle in
//     one process share one relay's lease: a call that finds the bucket claimed by
//     another call drains it after that one, up to its own Seq.
//   - Failures: when DispatchAt fails for a bucket (the store or the lease could not
//     be reached, a misconfiguration), every record of that bucket is reported in
//     BatchItemFailures, so Lambda retries from the earliest of them; the other
//     buckets' records count as handled. A message whose publish failed is
//     rescheduled by the relay as usual (retry with backoff, then park) and its
//     record counts as handled: the sweep publishes it when it is due.
//   - At-least-once, as everywhere: a retried record drains its bucket again, which
//     publishes nothing that was completed.
//
// # Limitations
//
//   - Lambda's retries and the relay's backoff are separate: a failed record is
//     retried by Lambda at once (subject to the event source mapping's settings), a
//     failed publish waits for its backoff and the sweep.
//   - A bucket held by a running worker elsewhere is left to it: mixing stream
//     dispatch with long-running workers is allowed but gains nothing.
//   - The handler needs the stream to carry the keys (KEYS_ONLY is enough); records
//     without them are ignored.
package dynamostreams

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/aws/aws-lambda-go/events"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// Relay is the part of a [relay.Relay] the handler calls.
type Relay interface {
	DispatchAt(ctx context.Context, bucket int, seq int64) (relay.Result, error)
}

var _ Relay = (*relay.Relay)(nil)

// DefaultMaxConcurrency is the default of Config.MaxConcurrency.
const DefaultMaxConcurrency = 4

// Config configures a [Handler]. The zero value is valid.
type Config struct {
	// MaxConcurrency bounds how many buckets one event dispatches at once. Defaults
	// to 4.
	MaxConcurrency int
	// Logger receives a warning per bucket whose dispatch failed. Defaults to
	// [slog.Default].
	Logger *slog.Logger
}

// Validate reports the first setting that cannot work, naming its field.
func (c Config) Validate() error {
	if c.MaxConcurrency < 0 {
		return fmt.Errorf("%w: dynamostreams: Config.MaxConcurrency is %d; it must be at least 1 (or 0 for the default %d)",
			outbox.ErrMisconfigured, c.MaxConcurrency, DefaultMaxConcurrency)
	}
	return nil
}

// Handler dispatches the messages the stream records of an event name. It is safe
// for concurrent use.
type Handler struct {
	r      Relay
	keys   streamKeys
	pk, sk string
	cfg    Config
}

// streamKeys is what the handler needs of the store's relay side: its key layout,
// to read a stream record's keys. The relay side of a [dynamostore.Store] (its
// Driver) implements it.
type streamKeys interface {
	Config() dynamostore.Config
	MessageKey(pk, sk string) (bucket int, seq int64, ok bool)
}

// New returns a handler that dispatches through r, a relay built on a
// [dynamostore.Store], and reads stream records with the key layout (KeyPrefix and
// key attribute names) of store, that store's relay side: pass store.Driver().
func New(r Relay, store driver.Store, cfg Config) (*Handler, error) {
	if r == nil || store == nil {
		return nil, fmt.Errorf("%w: dynamostreams: New needs a relay and the relay side (Driver()) of the dynamostore.Store it relays from", outbox.ErrMisconfigured)
	}
	keys, ok := store.(streamKeys)
	if !ok {
		return nil, fmt.Errorf("%w: dynamostreams: New needs the relay side of a dynamostore.Store (its Driver()), not a %T", outbox.ErrMisconfigured, store)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxConcurrency == 0 {
		cfg.MaxConcurrency = DefaultMaxConcurrency
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sc := keys.Config()
	return &Handler{r: r, keys: keys, pk: sc.PartitionKeyAttributeName, sk: sc.SortKeyAttributeName, cfg: cfg}, nil
}

// target is one bucket to drain, up to seq, and the stream records naming it.
type target struct {
	bucket  int
	seq     int64
	records []string // stream sequence numbers
}

// Handle dispatches the buckets and Seqs the event's INSERT records name, and
// reports the records of every bucket whose dispatch failed, for Lambda's partial
// batch response (ReportBatchItemFailures). It returns an error only when ctx ended
// before every bucket was tried; the response then still lists what failed.
func (h *Handler) Handle(ctx context.Context, ev events.DynamoDBEvent) (events.DynamoDBEventResponse, error) {
	byBucket := map[int]*target{}
	var order []int
	for _, r := range ev.Records {
		if r.EventName != string(events.DynamoDBOperationTypeInsert) {
			continue
		}
		pk, ok1 := stringKey(r.Change.Keys, h.pk)
		sk, ok2 := stringKey(r.Change.Keys, h.sk)
		if !ok1 || !ok2 {
			continue
		}
		bucket, seq, ok := h.keys.MessageKey(pk, sk)
		if !ok {
			continue
		}
		t := byBucket[bucket]
		if t == nil {
			t = &target{bucket: bucket, seq: seq}
			byBucket[bucket] = t
			order = append(order, bucket)
		}
		t.seq = max(t.seq, seq)
		t.records = append(t.records, r.Change.SequenceNumber)
	}
	var (
		mu     sync.Mutex
		failed []string
		wg     sync.WaitGroup
		sem    = make(chan struct{}, h.cfg.MaxConcurrency)
	)
	for _, b := range order {
		t := byBucket[b]
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			mu.Lock()
			failed = append(failed, t.records...)
			mu.Unlock()
			continue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, err := h.r.DispatchAt(ctx, t.bucket, t.seq); err != nil {
				h.cfg.Logger.Warn("dynamostreams: dispatching a bucket failed; Lambda retries its records",
					"bucket", t.bucket, "seq", t.seq, "records", len(t.records), "error", err)
				mu.Lock()
				failed = append(failed, t.records...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(failed)
	resp := events.DynamoDBEventResponse{BatchItemFailures: make([]events.DynamoDBBatchItemFailure, 0, len(failed))}
	for _, id := range failed {
		resp.BatchItemFailures = append(resp.BatchItemFailures, events.DynamoDBBatchItemFailure{ItemIdentifier: id})
	}
	return resp, ctx.Err()
}

// stringKey returns the string attribute name of keys.
func stringKey(keys map[string]events.DynamoDBAttributeValue, name string) (string, bool) {
	v, ok := keys[name]
	if !ok || v.DataType() != events.DataTypeString {
		return "", false
	}
	return v.String(), true
}
