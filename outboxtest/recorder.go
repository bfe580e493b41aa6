package outboxtest

import (
	"context"
	"sync"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Recorder is an [driver.Transport] that keeps every message it is asked to publish,
// in publish order, instead of sending it anywhere. Tests read back what a dispatcher
// published; benchmarks use it as a broker that costs next to nothing.
//
// It records envelopes exactly as given: unlike the Kafka and SQS transports it adds
// no idempotency-key header, and [Recorder.Received] adds only the message-ID header a
// broker would carry.
//
// A Recorder can be told to fail chosen messages ([Recorder.FailID],
// [Recorder.FailWhen]): a failed message is not recorded and is reported in an
// [*driver.PublishError], while the rest of its batch is recorded. Wrap a cause with
// [driver.Permanent] to make the failure permanent.
//
// The zero value is ready to use. A Recorder is safe for concurrent use.
type Recorder struct {
	// CountOnly makes the Recorder keep message IDs and counts but not the messages,
	// so long benchmarks do not hold every payload: Len, Unique, Duplicates, Count and
	// WaitFor work; Messages, ByKey and Received return nothing. Set it before the
	// first Publish.
	CountOnly bool

	mu        sync.Mutex
	n         int // messages recorded, duplicates included
	published []*driver.Envelope
	seen      map[uuid.UUID]int
	dups      int
	batches   int
	failIDs   map[uuid.UUID]*failRule
	failWhen  func(*driver.Envelope) error
	// wake is closed (and dropped) on the next record, for WaitFor.
	wake chan struct{}
}

type failRule struct {
	err   error
	times int // remaining failures; negative: always
}

var _ driver.Transport = (*Recorder)(nil)

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{} }

// Publish records a clone of every message in batch, except those a failure rule
// picks, which are reported in an [*driver.PublishError]. A done context fails the
// whole call with the context's error and records nothing.
func (r *Recorder) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches++
	if r.seen == nil {
		r.seen = make(map[uuid.UUID]int, len(batch))
	}
	var failed []driver.MessageError
	for _, env := range batch {
		if err := r.failure(env); err != nil {
			failed = append(failed, driver.MessageError{ID: env.ID, Err: err})
			continue
		}
		r.n++
		if !r.CountOnly {
			r.published = append(r.published, env.Clone())
		}
		if r.seen[env.ID]++; r.seen[env.ID] > 1 {
			r.dups++
		}
	}
	if r.wake != nil {
		close(r.wake)
		r.wake = nil
	}
	if failed != nil {
		return &driver.PublishError{Failed: failed}
	}
	return nil
}

// failure returns the injected error for env, if any. Called with the lock held.
func (r *Recorder) failure(env *driver.Envelope) error {
	if rule, ok := r.failIDs[env.ID]; ok {
		err := rule.err
		if rule.times > 0 {
			rule.times--
		}
		if rule.times == 0 {
			delete(r.failIDs, env.ID)
		}
		return err
	}
	if r.failWhen != nil {
		return r.failWhen(env)
	}
	return nil
}

// FailID makes the next times publishes of message id fail with err (every publish
// when times is negative). Wrap err with [driver.Permanent] for a permanent failure.
// A later call for the same id replaces the rule; times 0 removes it.
func (r *Recorder) FailID(id uuid.UUID, err error, times int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if times == 0 {
		delete(r.failIDs, id)
		return
	}
	if r.failIDs == nil {
		r.failIDs = make(map[uuid.UUID]*failRule)
	}
	r.failIDs[id] = &failRule{err: err, times: times}
}

// FailWhen sets a rule consulted for every message that no FailID rule covers: a
// non-nil error fails that message. fn runs under the Recorder's lock and must not
// call the Recorder. nil removes the rule.
func (r *Recorder) FailWhen(fn func(env *driver.Envelope) error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failWhen = fn
}

// Len is the number of messages recorded, duplicates included.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

// Batches is the number of Publish calls, failed ones included.
func (r *Recorder) Batches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.batches
}

// Messages returns every recorded message in publish order, duplicates included. The
// envelopes are the Recorder's own copies: read them, do not change them.
func (r *Recorder) Messages() []*driver.Envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*driver.Envelope(nil), r.published...)
}

// Unique is the number of distinct message IDs recorded.
func (r *Recorder) Unique() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// Duplicates is the number of recorded messages whose ID was recorded before: Len
// minus Unique.
func (r *Recorder) Duplicates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dups
}

// Count returns how many times message id was recorded.
func (r *Recorder) Count(id uuid.UUID) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

// ByKey returns, per key, the first deliveries of that key's messages in the order
// they were first recorded; redeliveries are left out. Keyless messages are left out
// too. Map keys are the message keys as strings (the empty key is "").
func (r *Recorder) ByKey() map[string][]*driver.Envelope {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]*driver.Envelope)
	first := make(map[uuid.UUID]bool, len(r.seen))
	for _, env := range r.published {
		if env.Key == nil || first[env.ID] {
			continue
		}
		first[env.ID] = true
		out[string(env.Key)] = append(out[string(env.Key)], env)
	}
	return out
}

// WaitFor blocks until at least n messages were recorded and returns nil, or returns
// ctx's error once ctx is done.
func (r *Recorder) WaitFor(ctx context.Context, n int) error {
	return r.wait(ctx, func() bool { return r.n >= n })
}

// WaitForUnique waits until n distinct messages were recorded (duplicates do not
// count), or ctx ends.
func (r *Recorder) WaitForUnique(ctx context.Context, n int) error {
	return r.wait(ctx, func() bool { return len(r.seen) >= n })
}

// wait waits until done, called with r.mu held, holds, or ctx ends.
func (r *Recorder) wait(ctx context.Context, done func() bool) error {
	for {
		r.mu.Lock()
		if done() {
			r.mu.Unlock()
			return nil
		}
		if r.wake == nil {
			r.wake = make(chan struct{})
		}
		wake := r.wake
		r.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Received returns the recorded messages of topic (every topic when topic is empty)
// as a broker would deliver them: each carries the [outbox.HeaderMessageID] header,
// appended when the envelope had none.
func (r *Recorder) Received(topic string) []Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Received
	for _, env := range r.published {
		if topic != "" && env.Topic != topic {
			continue
		}
		id := env.ID.String()
		headers := env.Headers
		if _, ok := env.Header(outbox.HeaderMessageID); !ok {
			headers = append(headers[:len(headers):len(headers)], outbox.Header{Key: outbox.HeaderMessageID, Value: []byte(id)})
		}
		out = append(out, Received{ID: id, Topic: env.Topic, Key: env.Key, Payload: env.Payload, Headers: headers})
	}
	return out
}

// Reset forgets every recorded message and counter. Failure rules stay.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n = 0
	r.published = nil
	r.seen = nil
	r.dups = 0
	r.batches = 0
}
