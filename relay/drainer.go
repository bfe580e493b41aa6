package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/lifecycle"
)

// drainer publishes the due envelopes of the buckets this relay holds: it selects
// what is due in a fetched batch, publishes it in waves that keep per-key order, and
// settles every outcome in the store (complete, reschedule, park).
type drainer struct {
	cfg       *Config
	log       *slog.Logger
	store     driver.Store
	transport driver.Transport
	retainer  driver.Retainer // nil unless Retention is on
	leases    *leaseTable
	meter     *meter
	health    *brokerHealth
	notifier  driver.Notifier // nil: the store announces no commits
	prober    driver.Prober   // nil: the store has no idle probe
	// sameKeyBatches: the transport keeps key order (driver.KeyOrderKeeper), so one
	// Publish call may carry several envelopes of a key.
	sameKeyBatches bool

	// failLogMu guards failLog, the per-bucket rate limit of publish-failure warnings.
	failLogMu sync.Mutex
	failLog   []warnLimit
}

// loop drains the buckets this relay holds: those a commit wake-up names, and every
// one at each PollInterval and after each round (when it runs cleanup first). It
// returns nil when asked to stop, or the error that stops the worker for good.
func (d *drainer) loop(r lifecycle.Run, rounds <-chan struct{}, cleanup func(context.Context)) error {
	ctx := r.Work
	w := wakeups{stop: r.Stopping(), done: ctx.Done(), rounds: rounds, woken: make(map[int]bool)}
	if d.notifier != nil {
		subCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		w.wake = d.notifier.Subscribe(subCtx)
	}
	var errDelay time.Duration
	for !r.Stopped() {
		w.collect()
		if w.cleanup {
			w.cleanup = false
			cleanup(ctx)
		}
		_, more, err := d.buckets(ctx, d.due(ctx, &w), false)
		switch {
		case err != nil && fatal(err):
			return err
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			// Not wakeable: commits keep coming while the store fails, and each would
			// otherwise cut the backoff short.
			errDelay = d.cfg.errorDelay(errDelay)
			d.log.Warn("relay: store or transport error; backing off", "error", err, "retry_in", errDelay)
			if !w.pause(errDelay, false) {
				return nil
			}
			continue
		}
		errDelay = 0
		if len(more) > 0 {
			for _, b := range more {
				w.woken[b] = true
			}
			continue
		}
		if !w.pause(d.cfg.PollInterval, true) {
			return nil
		}
	}
	return nil
}

// due returns the held buckets to drain now: those woken, and with a poll due every
// held one the store's idle probe does not rule out. It consumes the wake-ups.
func (d *drainer) due(ctx context.Context, w *wakeups) []int {
	var buckets []int
	for _, b := range d.leases.owned(d.cfg.now()) {
		if w.woken[b] || (w.all && d.mayHavePending(ctx, b)) {
			buckets = append(buckets, b)
		}
	}
	clear(w.woken)
	w.all = false
	return buckets
}

// mayHavePending asks the store's cheap idle probe, if it has one, whether a polled
// bucket is worth a full fetch. A probe error answers yes: the fetch then reports it.
func (d *drainer) mayHavePending(ctx context.Context, bucket int) bool {
	if d.prober == nil {
		return true
	}
	pending, err := d.prober.HasPending(ctx, bucket)
	return pending || err != nil
}

// wakeups collects what makes the drain loop drain: commit wake-ups naming buckets,
// finished rounds, and the poll timer.
type wakeups struct {
	stop, done <-chan struct{}
	rounds     <-chan struct{}
	wake       <-chan int // nil: none, or closed
	woken      map[int]bool
	// all: poll every held bucket; cleanup: a round ran, so retention may be due.
	all, cleanup bool
}

// collect takes the wake-ups and rounds that arrived while the loop was busy.
func (w *wakeups) collect() {
	for {
		select {
		case b, ok := <-w.wake:
			if !ok {
				w.wake = nil
				return
			}
			w.woken[b] = true
		case <-w.rounds:
			w.all, w.cleanup = true, true
		default:
			return
		}
	}
}

// pause waits for wait, a stop, a round or (when wakeable) a wake-up; it reports
// false on a stop.
func (w *wakeups) pause(wait time.Duration, wakeable bool) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case <-w.stop:
			return false
		case <-w.done:
			return false
		case <-timer.C:
			w.all = true
			return true
		case <-w.rounds:
			w.all, w.cleanup = true, true
			if wakeable {
				return true
			}
		case b, ok := <-w.wake:
			if !ok {
				w.wake = nil
				continue
			}
			w.woken[b] = true
			if wakeable {
				return true
			}
		}
	}
}

// pass is the outcome of one batch of one bucket.
type pass struct {
	Result
	// more: the bucket may hold more due envelopes: the store said the batch was
	// full or cut (driver.Batch.More), and this pass made progress.
	more bool
	// reached: the envelope DispatchAt looks for was handled or is held back.
	reached bool
}

// buckets drains buckets in parallel, up to MaxConcurrency at once. With untilEmpty it
// keeps draining each bucket while it has due envelopes; otherwise it drains one batch
// each and returns the buckets that may have more.
func (d *drainer) buckets(ctx context.Context, buckets []int, untilEmpty bool) (Result, []int, error) {
	var (
		mu    sync.Mutex
		res   Result
		more  []int
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, d.cfg.MaxConcurrency)
	)
	for _, b := range buckets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			local, hasMore, err := d.bucket(ctx, b, untilEmpty)
			mu.Lock()
			defer mu.Unlock()
			res.add(local)
			if hasMore && err == nil {
				more = append(more, b)
			}
			if err != nil && (first == nil || errors.Is(err, outbox.ErrMisconfigured)) {
				first = err
			}
		})
	}
	wg.Wait()
	slices.Sort(more)
	return res, more, first
}

// bucket drains bucket b under its lock: one batch, or with untilEmpty every batch
// while it has due envelopes. It reports whether b may have more.
func (d *drainer) bucket(ctx context.Context, b int, untilEmpty bool) (Result, bool, error) {
	var res Result
	if err := d.leases.lock(ctx, b); err != nil {
		return res, false, err
	}
	defer d.leases.unlock(b)
	for {
		p, err := d.once(ctx, b, -1)
		res.add(p.Result)
		if err != nil || !p.more || !untilEmpty {
			return res, p.more, err
		}
	}
}

// once fetches one batch of bucket b and publishes what is due. With upTo >= 0 it
// stops at the envelope with that Seq. The caller holds the bucket's lock.
func (d *drainer) once(ctx context.Context, b int, upTo int64) (pass, error) {
	var p pass
	batch, now, ok, err := d.fetch(ctx, b)
	if err != nil || !ok {
		return p, err
	}
	envs := batch.Envelopes
	if upTo >= 0 {
		envs, p.reached = cutAt(envs, upTo, !batch.More)
	}
	for _, e := range envs {
		if err := checkEnvelope(e, d.cfg.BucketCount); err != nil {
			d.log.Error("relay: bucket count mismatch; the relay stops", "bucket", b, "error", err)
			return p, err
		}
	}
	due, blocked := selectDue(envs, now, d.cfg.Unordered)
	if finished, err := d.publishWaves(ctx, b, d.waves(due), blocked, &p); err != nil || !finished {
		return p, err
	}
	// A batch that published nothing (every envelope held back behind a backed-off
	// one of its key) would come back the same: wait for a change instead.
	progressed := p.Published+p.Retried+p.Parked > 0
	p.more = batch.More && progressed
	if upTo >= 0 {
		// A window held back entirely cannot reach the target: stop rather than spin.
		p.more = !p.reached && progressed
	}
	return p, nil
}

// emptyCutRefetches bounds how often one pass fetches again after the store cut a
// batch before its first envelope (driver.Batch.More with no envelope: a DynamoDB
// gap below the head filled during the read).
const emptyCutRefetches = 3

// fetch reads one batch of bucket b, if this relay may publish from it before and
// after the read; ok is false if it may not. A batch the store cut before its first
// envelope is fetched again at once, up to emptyCutRefetches times.
func (d *drainer) fetch(ctx context.Context, b int) (batch driver.Batch, now time.Time, ok bool, err error) {
	for try := 0; ; try++ {
		if !d.leases.publishable(b, d.cfg.now()) {
			return driver.Batch{}, now, false, nil
		}
		batch, err = d.store.Fetch(ctx, b, d.cfg.BatchSize)
		if err != nil {
			return driver.Batch{}, now, false, err
		}
		if len(batch.Envelopes) > 0 || !batch.More || try == emptyCutRefetches {
			break
		}
	}
	now = d.cfg.now()
	return batch, now, d.leases.publishable(b, now), nil
}

// cutAt cuts a window of envelopes after the one with Seq upTo. The target is handled
// in this window (reached) if the window reaches it, or if the bucket ends before it
// (it is gone already): bucketEnds.
func cutAt(envs []*driver.Envelope, upTo int64, bucketEnds bool) ([]*driver.Envelope, bool) {
	reached := bucketEnds
	for i, e := range envs {
		if e.Seq >= upTo {
			reached = true
		}
		if e.Seq > upTo {
			return envs[:i], reached
		}
	}
	return envs, reached
}

// selectDue returns the due envelopes in Seq order, and the keys held back: a key
// whose earlier envelope is not due (it failed and waits for its retry) holds its
// later envelopes back.
func selectDue(envs []*driver.Envelope, now time.Time, unordered bool) ([]*driver.Envelope, map[string]bool) {
	blocked := make(map[string]bool)
	var due []*driver.Envelope
	for _, e := range envs {
		keyed := e.Key != nil && !unordered
		if keyed && blocked[string(e.Key)] {
			continue
		}
		if !e.Due(now) {
			if keyed {
				blocked[string(e.Key)] = true
			}
			continue
		}
		due = append(due, e)
	}
	return due, blocked
}

// waves splits due envelopes into publish calls (see keyWaves).
func (d *drainer) waves(due []*driver.Envelope) [][]*driver.Envelope {
	return keyWaves(due, d.cfg.Unordered || d.sameKeyBatches)
}

// keyWaves splits envelopes into publish calls: the n-th envelope of a key goes in
// wave n, so a call carries at most one envelope per key and a failure can still
// hold back that key's later envelopes. Keys that are all distinct (the usual case)
// make one wave, as does together (no order to keep, or a transport that keeps key
// order itself).
func keyWaves(envs []*driver.Envelope, together bool) [][]*driver.Envelope {
	if together {
		return [][]*driver.Envelope{envs}
	}
	var waves [][]*driver.Envelope
	seen := make(map[string]int)
	for _, e := range envs {
		w := 0
		if e.Key != nil {
			w = seen[string(e.Key)]
			seen[string(e.Key)] = w + 1
		}
		if w == len(waves) {
			waves = append(waves, nil)
		}
		waves[w] = append(waves[w], e)
	}
	return waves
}

// publishWaves publishes the waves in order into p, dropping from each the keys that
// failed (or were blocked) before. What the broker acknowledged in every wave is
// completed in one call at the end (and before an early return), so waves cost no
// extra store write. It reports false if the bucket's lease stopped it early.
func (d *drainer) publishWaves(ctx context.Context, b int, waves [][]*driver.Envelope, blocked map[string]bool, p *pass) (finished bool, err error) {
	var acked []*driver.Envelope
	completeAll := func() error {
		if err := d.complete(ctx, acked); err != nil {
			return err
		}
		p.Published += len(acked)
		acked = nil
		return nil
	}
	for i, wave := range waves {
		if i > 0 {
			wave = slices.DeleteFunc(wave, func(e *driver.Envelope) bool { return blocked[string(e.Key)] })
		}
		if len(wave) == 0 {
			break
		}
		left, ok := d.leases.left(b, d.cfg.now())
		if !ok {
			return false, completeAll()
		}
		out, err := d.publish(ctx, wave, left)
		p.add(out.Result)
		acked = append(acked, out.acked...)
		if errors.Is(err, errLeaseRanOut) {
			d.log.Warn("relay: a publish outlasted the bucket's lease and was abandoned; its messages go out again", "bucket", b, "lease_left", left)
			// It still counts as an attempt, so a message that can never be published
			// within a lease parks instead of holding its bucket for good.
			cause := fmt.Errorf("%w (%s of the lease was left when it started)", errLeaseRanOut, left.Round(time.Millisecond))
			res, serr := d.settleFailures(ctx, wave, allFailed(wave, cause), d.cfg.now())
			p.add(res)
			if serr != nil {
				return false, serr
			}
			return false, completeAll()
		}
		if err != nil {
			if ctx.Err() == nil {
				_ = completeAll() // what the broker took need not go out again
			}
			return false, err
		}
		if !d.cfg.Unordered {
			for k := range out.failedKeys {
				blocked[k] = true
			}
		}
	}
	return true, completeAll()
}

// errLeaseRanOut: a publish was still in flight when its bucket's lease lapsed.
var errLeaseRanOut = errors.New("relay: publish outlasted the bucket's lease")

// published is the outcome of one Publish call, settled in the store.
type published struct {
	Result
	// acked are the envelopes the broker acknowledged, to complete.
	acked []*driver.Envelope
	// failedKeys are the keys of the envelopes that failed.
	failedKeys map[string]bool
}

// publish sends one batch and settles every outcome: the acknowledged envelopes are
// returned to complete, each key's first failed one is rescheduled or parked.
//
// The publish may take at most leaseLeft: a peer can claim the bucket once the lease
// lapses, so a batch still in flight then is abandoned (errLeaseRanOut), with nothing
// assumed sent; the caller charges it as an attempt.
func (d *drainer) publish(ctx context.Context, batch []*driver.Envelope, leaseLeft time.Duration) (published, error) {
	pctx, cancel := context.WithTimeout(ctx, leaseLeft)
	began := d.cfg.now() // a failure streak starts here (brokerHealth.published)
	start := time.Now()
	err := d.transport.Publish(pctx, batch)
	took := time.Since(start)
	cancel()
	if err != nil && pctx.Err() != nil {
		if ctx.Err() != nil {
			// Shutting down: nothing is assumed sent and nothing counts as an attempt.
			d.meter.abandoned(ctx, batch, start, took, err)
			return published{}, ctx.Err()
		}
		if errors.Is(pctx.Err(), context.DeadlineExceeded) {
			d.meter.abandoned(ctx, batch, start, took, err)
			d.health.published(began, d.cfg.now(), 0, true)
			return published{}, errLeaseRanOut
		}
	}
	failed := failures(batch, err)
	now := d.cfg.now()
	out := d.sortOutcomes(batch, failed)
	d.meter.obs.Published(ctx, batch, out.acked, start, took, err)
	permanentFailure := false
	for _, cause := range failed {
		permanentFailure = permanentFailure || driver.IsPermanent(cause)
	}
	d.health.published(began, now, len(out.acked), err != nil && !permanentFailure)
	res, err := d.settleFailures(ctx, batch, failed, now)
	out.Result = res
	return out, err
}

// allFailed maps every envelope of batch to cause.
func allFailed(batch []*driver.Envelope, cause error) map[uuid.UUID]error {
	failed := make(map[uuid.UUID]error, len(batch))
	for _, e := range batch {
		failed[e.ID] = cause
	}
	return failed
}

// failures maps each envelope that failed in a Publish call to its cause.
func failures(batch []*driver.Envelope, err error) map[uuid.UUID]error {
	if err == nil {
		return map[uuid.UUID]error{}
	}
	var pe *driver.PublishError
	if errors.As(err, &pe) {
		failed := make(map[uuid.UUID]error, len(pe.Failed))
		for _, f := range pe.Failed {
			failed[f.ID] = f.Err
		}
		return failed
	}
	return allFailed(batch, err)
}

// sortOutcomes splits a batch into the acknowledged envelopes and the keys that
// failed, counting (and warning about) an acknowledgement that overtook an earlier
// failure of its key.
func (d *drainer) sortOutcomes(batch []*driver.Envelope, failed map[uuid.UUID]error) published {
	out := published{acked: make([]*driver.Envelope, 0, len(batch)), failedKeys: make(map[string]bool)}
	for _, e := range batch {
		if _, bad := failed[e.ID]; bad {
			if e.Key != nil {
				out.failedKeys[string(e.Key)] = true
			}
			continue
		}
		if e.Key != nil && out.failedKeys[string(e.Key)] && !d.cfg.Unordered {
			d.meter.outOfOrder.Add(1)
			d.log.Warn("relay: the transport acknowledged a message after failing an earlier one of its key in the same batch; first deliveries of this key are out of order",
				"message_id", e.ID, "topic", e.Topic, "bucket", e.Bucket)
		}
		out.acked = append(out.acked, e)
	}
	return out
}

// settleFailures reschedules or parks each failed envelope. Only a key's first
// failure in the batch is an attempt: the key's later failed envelopes were held back
// by it (or share its fate), stay pending and due, and the next fetch holds them
// behind it, at no cost in attempts or backoff.
func (d *drainer) settleFailures(ctx context.Context, batch []*driver.Envelope, failed map[uuid.UUID]error, now time.Time) (Result, error) {
	var res Result
	charged := make(map[string]bool)
	for _, e := range batch {
		cause, bad := failed[e.ID]
		if !bad {
			continue
		}
		if e.Key != nil && !d.cfg.Unordered {
			if charged[string(e.Key)] {
				continue
			}
			charged[string(e.Key)] = true
		}
		parked, err := d.settle(ctx, e, cause, now)
		if err != nil {
			return res, err
		}
		if parked {
			res.Parked++
		} else {
			res.Retried++
		}
	}
	return res, nil
}

// settle parks a failed envelope, if its failure is permanent or it ran out of
// attempts, or reschedules it with backoff. A relay cut off from its broker parks
// nothing: a peer may deliver it.
func (d *drainer) settle(ctx context.Context, e *driver.Envelope, cause error, now time.Time) (parked bool, err error) {
	attempts := e.Attempts + 1
	msg := cause.Error()
	permanent := driver.IsPermanent(cause)
	if permanent || (attempts >= d.cfg.MaxAttempts && !d.health.cutOff(ctx, now, 0)) {
		if err := d.store.Park(ctx, e, msg); err != nil {
			return false, err
		}
		d.meter.park(ctx, e, permanent, msg)
		d.log.Warn("relay: message parked; it waits for an operator to requeue or purge it",
			"message_id", e.ID, "topic", e.Topic, "bucket", e.Bucket, "attempts", attempts,
			"permanent", permanent, "error", msg)
		return true, nil
	}
	next := now.Add(d.cfg.backoff(attempts))
	if err := d.store.Reschedule(ctx, e, next, msg); err != nil {
		return false, err
	}
	d.meter.retry(ctx, e, attempts, msg)
	d.logFailure(e, attempts, next, msg, now)
	return false, nil
}

// complete forgets what the broker acknowledged in a drain pass, in one call: deletes
// it, or marks it dispatched when retention is on. On failure the envelopes stay
// pending and go out again: duplicates, never a loss.
func (d *drainer) complete(ctx context.Context, acked []*driver.Envelope) error {
	if len(acked) == 0 {
		return nil
	}
	var err error
	if d.cfg.Retention > 0 {
		err = d.retainer.MarkDispatched(ctx, acked, d.cfg.now())
	} else {
		err = d.store.Complete(ctx, acked)
	}
	if err != nil {
		return err
	}
	d.meter.completed(ctx, acked)
	return nil
}

// logFailure logs a failed publish that will be retried: at WARN for the first
// failure of a bucket in each LeaseRenewInterval, with the number of failures logged
// at DEBUG since the previous warning; at DEBUG otherwise.
func (d *drainer) logFailure(e *driver.Envelope, attempts int, next time.Time, cause string, now time.Time) {
	d.failLogMu.Lock()
	warn, suppressed := d.failLog[e.Bucket].next(now, d.cfg.LeaseRenewInterval)
	d.failLogMu.Unlock()
	attrs := []any{"message_id", e.ID, "topic", e.Topic, "bucket", e.Bucket, "attempts", attempts,
		"next_attempt", next, "error", cause}
	if warn {
		d.log.Warn("relay: publish failed; retrying later",
			append(attrs, "suppressed", suppressed)...)
		return
	}
	d.log.Debug("relay: publish failed; retrying later", attrs...)
}

// checkEnvelope refuses an envelope written with another bucket count than n.
func checkEnvelope(env *driver.Envelope, n int) error {
	if env.Bucket < 0 || env.Bucket >= n {
		return fmt.Errorf("%w: envelope %s is in bucket %d, outside this relay's %d buckets; every writer, store and relay must use one count",
			outbox.ErrMisconfigured, env.ID, env.Bucket, n)
	}
	if env.BucketCount != 0 && env.BucketCount != n {
		return fmt.Errorf("%w: envelope %s in bucket %d was written with bucket count %d, but this relay uses %d; every writer, store and relay must use one count (drain the store before changing it)",
			outbox.ErrMisconfigured, env.ID, env.Bucket, env.BucketCount, n)
	}
	return nil
}
