package kafkatransport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// publish is one Publish call: the batch, each envelope's outcome, and the call's
// clock.
//
// The clock has three marks when AckTimeout is positive. A quarter of it bounds the
// metadata look-up of topics the client does not know yet. Halfway (withdraw) the
// call starts no new produce round and withdraws from the client what it has not
// sent; at AckTimeout (giveUp) it stops waiting for records already on the wire. So
// the call returns within AckTimeout, what [Transport.PublishTimeout] reports.
type publish struct {
	t     *Transport
	batch []*driver.Envelope
	// errs holds each envelope's failure, by batch index.
	errs []error
	// held maps the keys of messages that failed to the batch index of the first
	// failure: later messages of the key in the batch are held back, so a key's order
	// never skips a message.
	held map[string]int
	// refusals counts, by batch index, the brokers' refusals of the record as too
	// large while it shared the topic's batches with others; again says why a
	// record is being produced again.
	refusals []uint8
	again    []error

	lookUpBy         time.Time // zero when AckTimeout is negative
	withdrawAt       time.Time
	withdraw, giveUp <-chan struct{} // closed at their mark; nil when AckTimeout is negative
	stop             func()
}

func (t *Transport) newPublish(batch []*driver.Envelope, errs []error) *publish {
	p := &publish{
		t:        t,
		batch:    batch,
		errs:     errs,
		refusals: make([]uint8, len(batch)),
		again:    make([]error, len(batch)),
		stop:     func() {},
	}
	if d := t.cfg.AckTimeout; d > 0 {
		now := time.Now()
		p.lookUpBy = now.Add(d / 4)
		p.withdrawAt = now.Add(d / 2)
		w, stopW := context.WithDeadline(context.Background(), p.withdrawAt)
		g, stopG := context.WithDeadline(context.Background(), now.Add(d))
		p.withdraw, p.giveUp = w.Done(), g.Done()
		p.stop = func() { stopW(); stopG() }
	}
	return p
}

// fail records envelope i's failure and holds back the later messages of its key.
func (p *publish) fail(i int, err error) {
	p.errs[i] = err
	if env := p.batch[i]; env.Key != nil {
		if p.held == nil {
			p.held = map[string]int{}
		}
		if first, ok := p.held[keyOf(env)]; !ok || i < first {
			p.held[keyOf(env)] = i
		}
	}
}

// isHeld reports whether an earlier message of envelope i's key failed.
func (p *publish) isHeld(i int) bool {
	env := p.batch[i]
	if env.Key == nil {
		return false
	}
	first, ok := p.held[keyOf(env)]
	return ok && first < i
}

// withdrawn reports whether the withdraw mark has passed.
func (p *publish) withdrawn() bool {
	select {
	case <-p.withdraw:
		return true
	default:
		return false
	}
}

// until bounds ctx by the mark at, when there is one.
func until(ctx context.Context, at time.Time) (context.Context, context.CancelFunc) {
	if at.IsZero() {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, at)
}

// lookUp fails the records of topics the cluster does not have, at once, and returns
// the others. Topics the client's metadata already has cost nothing; the others take
// one metadata request, bounded by a quarter of AckTimeout. If no answer comes in
// time, the records go to the client, which looks the topics up itself. It returns
// ctx's error when ctx ended first.
func (p *publish) lookUp(ctx context.Context, send []int) ([]int, error) {
	var unsure []string
	seen := map[string]bool{}
	for _, i := range send {
		topic := p.batch[i].Topic
		if seen[topic] {
			continue
		}
		seen[topic] = true
		if !p.t.knownToClient(topic) {
			unsure = append(unsure, topic)
		}
	}
	if len(unsure) == 0 {
		return send, nil
	}
	lctx, cancel := until(ctx, p.lookUpBy)
	missing, err := p.t.missingTopics(lctx, unsure)
	cancel()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err != nil || len(missing) == 0 {
		return send, nil
	}
	kept := make([]int, 0, len(send))
	for _, i := range send {
		if topic := p.batch[i].Topic; missing[topic] {
			p.fail(i, p.t.unknownTopic(topic, kerr.UnknownTopicOrPartition))
			continue
		}
		kept = append(kept, i)
	}
	return kept, nil
}

// errNoAck reports records the broker did not acknowledge before Publish withdrew
// them: the client failed them without sending them, or the broker refused them.
var errNoAck = errors.New("kafkatransport: no acknowledgement within half of Config.AckTimeout; withdrawn: the client no longer holds the message")

// errInFlight reports records the broker did not answer for by AckTimeout: the
// client still holds some of them and may deliver them later.
var errInFlight = errors.New("kafkatransport: no answer from the broker within Config.AckTimeout; records already sent stay with the client, which may still deliver them")

// errNotSent reports records Publish never handed to the client.
var errNotSent = errors.New("kafkatransport: not sent within half of Config.AckTimeout")

// produce hands the records batch[i], i in send, to the client in rounds, each one
// ProduceSync (which stops the client's linger for their partitions, so a batch does
// not wait out kgo.ProducerLinger), and records each envelope's outcome. It returns
// ctx's error when ctx ended first.
//
// A round carries every pending record, except that a paced topic (one whose brokers
// refused a batch as too large) gets only the records, in batch order, that keep what
// the transport has in flight for it within its limit; a record that can never share
// a batch goes alone. A record refused as too large while it shared the topic's
// batches is produced again, paced, then alone; only a record refused alone fails, as
// too large, permanently. Records another call's cut failed (see below) are produced
// again too. A message that failed holds back its key's later messages.
//
// Each round runs ProduceSync in a goroutine of its own, so that produce can stop
// waiting for it; Close waits for every such goroutine. After Close, produce starts no
// round and reports what it would have sent failed with errClosed.
//
// The records of a round carry a context of their own that only a cut ends. At the
// withdraw mark produce cuts the round under way: the client then fails every record
// it has not sent yet, and produce waits until the giveUp mark, or until ctx ends, for
// the records already on the wire (an idempotent producer cannot withdraw them). So a
// record is reported failed with errNoAck only once this client can no longer deliver
// it; if the wire stays silent, every record of the round is reported with
// errInFlight; records never handed to the client are reported with errNotSent; if
// ctx ends first, produce returns ctx's error. A cut fails everything the client
// buffered behind the cut records in their partition, other Publish calls' records
// too.
func (p *publish) produce(ctx context.Context, pending []int) error {
	p.refreshLimits(ctx, pending)
	for len(pending) > 0 {
		if p.withdrawn() {
			p.failUnsent(pending)
			return nil
		}
		round, rest, alone, wake := p.admit(pending)
		if len(round) == 0 {
			if len(rest) == 0 {
				return nil // every pending record was held back
			}
			select {
			case <-wake:
			case <-p.withdraw:
			case <-ctx.Done():
				return ctx.Err()
			}
			pending = rest
			continue
		}
		held := p.holdings(round, alone)
		if !p.t.begin() {
			p.t.release(held)
			for _, i := range append(round, rest...) {
				p.fail(i, errClosed)
			}
			return nil
		}
		retry, err := p.send(ctx, round, alone, held)
		if err != nil {
			return err
		}
		pending = append(retry, rest...)
		slices.Sort(pending) // batch order, so a key's records go out in order again
	}
	return nil
}

// admit takes from pending, in batch order, what goes to the client in this round,
// and reserves it in the topics' inflight totals. It fails records whose key failed,
// returns the rest for a later round and, when nothing could be taken, a channel
// closed once another round releases what it held. alone marks the records that go
// without any other record of their topic in flight.
func (p *publish) admit(pending []int) (round, rest []int, alone map[int]bool, wake <-chan struct{}) {
	t := p.t
	t.tmu.Lock()
	defer t.tmu.Unlock()
	blocked := map[string]bool{} // topics of which nothing more goes in this round
	for _, i := range pending {
		if p.isHeld(i) {
			p.fail(i, errHeldBack)
			continue
		}
		env := p.batch[i]
		if blocked[env.Topic] {
			rest = append(rest, i)
			continue
		}
		s := t.state(env.Topic)
		w := wireSize(env)
		switch {
		case s.exclusive:
			blocked[env.Topic] = true
			rest = append(rest, i)
			continue
		case p.refusals[i] >= 2 || (s.paced && w > s.budget()):
			// Refused twice with others, or too large to share a batch: alone.
			blocked[env.Topic] = true
			if s.inflight > 0 {
				rest = append(rest, i)
				continue
			}
			s.exclusive = true
			if alone == nil {
				alone = map[int]bool{}
			}
			alone[i] = true
		case s.paced && s.inflight+w > s.budget():
			blocked[env.Topic] = true
			rest = append(rest, i)
			continue
		}
		s.inflight += w
		round = append(round, i)
	}
	if len(round) == 0 && len(rest) > 0 {
		wake = t.wake
	}
	return round, rest, alone, wake
}

// holdings sums what round reserved, by topic.
func (p *publish) holdings(round []int, alone map[int]bool) map[string]holding {
	held := map[string]holding{}
	for _, i := range round {
		env := p.batch[i]
		h := held[env.Topic]
		h.bytes += wireSize(env)
		h.exclusive = h.exclusive || alone[i]
		held[env.Topic] = h
	}
	return held
}

// send produces one round and sorts its results: it returns the records to produce
// again, or ctx's error when ctx ended first.
func (p *publish) send(ctx context.Context, round []int, alone map[int]bool, held map[string]holding) ([]int, error) {
	t := p.t
	recs, rctx, cut := t.records(p.batch, round)
	defer cut()
	done := make(chan kgo.ProduceResults, 1)
	go func() {
		defer t.end()
		// rctx also bounds waiting for buffer space: a cut ends that wait.
		results := t.client.ProduceSync(rctx, recs...)
		t.release(held)
		done <- results
	}()
	withdrawn := false
	var results kgo.ProduceResults
	select {
	case results = <-done:
	case <-ctx.Done():
		// Shutting down or out of lease: withdraw what the client has not sent and
		// report ctx's error.
		return nil, ctx.Err()
	case <-p.withdraw:
		withdrawn = true
		cut()
		// Records already on the wire wait for the broker's answer, until giveUp, so a
		// dead cluster cannot hold Publish for ever.
		select {
		case results = <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-p.giveUp:
			for _, i := range round {
				p.fail(i, fmt.Errorf("%w (waited %s)", errInFlight, t.cfg.AckTimeout))
			}
			return nil, nil
		}
	}
	index := make(map[*kgo.Record]int, len(recs))
	for j, r := range recs {
		index[r] = round[j]
	}
	var (
		retry   []int
		refused map[string]bool // topics with a too-large refusal; true: a shared one
	)
	for _, res := range results {
		i := index[res.Record]
		env := p.batch[i]
		m := metaOf(res.Record)
		switch {
		case res.Err == nil:
		case cutOff(res.Err) && withdrawn:
			p.fail(i, fmt.Errorf("%w (withdrawn after %s)", errNoAck, t.cfg.AckTimeout/2))
		case cutOff(res.Err):
			p.again[i] = fmt.Errorf("failed for another publish's cut: %w", res.Err)
			retry = append(retry, i) // another call's cut failed it
		case tooLarge(res.Err) && (m == nil || !m.missing.Load()):
			if refused == nil {
				refused = map[string]bool{}
			}
			if alone[i] {
				p.fail(i, p.tooLargeAlone(env, res.Err))
				if _, ok := refused[env.Topic]; !ok {
					refused[env.Topic] = false
				}
				continue
			}
			// Refused with batch-mates: the batch was too large, perhaps not the record.
			refused[env.Topic] = true
			p.refusals[i]++
			p.again[i] = fmt.Errorf("refused with other records as too large for topic %q: %w", env.Topic, res.Err)
			retry = append(retry, i)
		default:
			p.fail(i, t.classify(env, m, res.Err))
		}
	}
	for topic, shared := range refused {
		p.pace(ctx, topic, shared)
	}
	return retry, nil
}

// tooLarge reports a refusal of a record batch as too large.
func tooLarge(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge)
}

// pace makes the topic paced, after a broker refused a batch of it as too large, and
// learns its limit when the topic was not paced yet or a shared batch was refused
// (the limit may have been lowered). The request is bounded by the withdraw mark.
func (p *publish) pace(ctx context.Context, topic string, shared bool) {
	t := p.t
	t.tmu.Lock()
	s := t.state(topic)
	learn := !s.paced || shared
	s.paced = true
	t.tmu.Unlock()
	if learn {
		lctx, cancel := until(ctx, p.withdrawAt)
		defer cancel()
		t.learnLimit(lctx, topic)
	}
}

// refreshLimits asks again for the limits of the paced topics among pending that were
// last asked for more than limitRefresh ago, or never answered.
func (p *publish) refreshLimits(ctx context.Context, pending []int) {
	t := p.t
	var stale []string
	t.tmu.Lock()
	for _, i := range pending {
		topic := p.batch[i].Topic
		if s := t.topics[topic]; s != nil && s.paced && time.Since(s.learnedAt) > limitRefresh && !slices.Contains(stale, topic) {
			s.learnedAt = time.Now() // one Publish asks; the others go on with the known limit
			stale = append(stale, topic)
		}
	}
	t.tmu.Unlock()
	for _, topic := range stale {
		lctx, cancel := until(ctx, p.withdrawAt)
		t.learnLimit(lctx, topic)
		cancel()
	}
}

// tooLargeAlone is the permanent failure of a record a broker refused as too large
// while nothing else of its topic was in flight.
func (p *publish) tooLargeAlone(env *driver.Envelope, err error) error {
	p.t.tmu.Lock()
	limit := p.t.state(env.Topic).limit
	p.t.tmu.Unlock()
	known := "could not be described"
	if limit > 0 {
		known = fmt.Sprintf("is %d", limit)
	}
	return driver.Permanent(fmt.Errorf("%w: kafkatransport: topic %q refused the message on its own as too large (up to %d bytes as a record; the topic's %s %s): kafkatransport: produce to %q: %w",
		outbox.ErrTooLarge, env.Topic, wireSize(env), topicLimitConfig, known, env.Topic, err))
}

// failUnsent reports the records never handed to the client before the withdraw
// mark: transient, they go out on the relay's next attempt.
func (p *publish) failUnsent(pending []int) {
	for _, i := range pending {
		switch {
		case p.isHeld(i):
			p.fail(i, errHeldBack)
		case p.again[i] != nil:
			p.fail(i, fmt.Errorf("%w (%s) to be produced again, after it was %w", errNotSent, p.t.cfg.AckTimeout/2, p.again[i]))
		default:
			p.fail(i, fmt.Errorf("%w (%s): topic %q is paced to its %s, and this message's turn did not come", errNotSent, p.t.cfg.AckTimeout/2, p.batch[i].Topic, topicLimitConfig))
		}
	}
}
