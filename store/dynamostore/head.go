package dynamostore

import (
	"context"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/outboxkit/outbox/driver"
)

// tailGrace is how long a reservation above the last fetched message may stay
// uncommitted before a backed-off bucket stops fetching for it: after that it counts
// as abandoned (a cancelled transaction's numbers), and only a later reservation, a
// commit in this process or the head's due time make the bucket worth a fetch again.
const tailGrace = 30 * time.Second

// heldBackGrace is how long after a fetch a message that the fetch already returned
// due, behind an earlier message of its key, stops counting as held back: see
// heldHead.earliest.
const heldBackGrace = 30 * time.Second

// heldHead is what this store knows of a bucket's pending messages after a fetch
// whose every message was left pending: their keys and due times, kept up to date by
// Complete, Reschedule and Park. It lets HasPending answer no, without a
// fetch, while nothing in the bucket can be published before a due time.
type heldHead struct {
	msgs []heldMsg // in Seq order
	// full: the fetch returned as many messages as asked, so what lies beyond them
	// waits behind them anyway.
	full bool
	// counter is the highest sequence number the fetch accounts for; a bucket whose
	// counter passed it received a reservation since.
	counter int64
	// fetched is when the fetch returned; a due time after it is one the relay has
	// not seen come.
	fetched time.Time
}

type heldMsg struct {
	seq   int64
	key   string
	keyed bool
	next  time.Time
}

// ahead is a counter value HasPending saw above a held head's, and since when.
type ahead struct {
	value int64
	since time.Time
}

// earliest is when the held head may next hold a message the relay would publish:
// the earliest due time of all its messages, whatever their key. The store does not
// know whether its relay keeps per-key order (relay.Config.Unordered), so a later
// message of a key whose first message backs off counts with its own due time: an
// unordered relay publishes it then.
//
// One kind of message counts later: a message behind an earlier one of its key that
// was due already when the fetch returned it, and that the relay left pending since
// (a Reschedule moves its due time past the fetch). A relay that keeps key order
// left it for exactly that reason, and fetching it again on every poll would buy
// nothing; a relay that does not would have published or rescheduled it with the
// rest of the batch, unless that drain was cut short (a lease about to lapse, a
// publish that outlasted it). Such a message counts as due heldBackGrace after the
// fetch, so a cut-short drain of an unordered relay delays it by that much at most,
// and a key held back in order costs one fetch per heldBackGrace.
func (h *heldHead) earliest() time.Time {
	var (
		first time.Time
		found bool
		keys  = map[string]bool{}
	)
	for _, m := range h.msgs {
		at := m.next
		if m.keyed {
			if keys[m.key] && !m.next.After(h.fetched) {
				at = h.fetched.Add(heldBackGrace)
			}
			keys[m.key] = true
		}
		if !found || at.Before(first) {
			first, found = at, true
		}
	}
	return first
}

// holdHead records what a fetch returned, if it returned the bucket's head whole:
// not cut before a gap and with every item decoded.
func (s *Store) holdHead(bucket int, envs []*driver.Envelope, items, limit int, whole bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !whole || len(envs) == 0 || len(envs) != items {
		s.heads[bucket] = nil
		return
	}
	h := &heldHead{full: items >= limit, msgs: make([]heldMsg, len(envs)), fetched: time.Now()}
	for i, e := range envs {
		h.msgs[i] = heldMsg{seq: e.Seq, key: string(e.Key), keyed: e.Key != nil, next: e.NextAttemptAt}
	}
	h.counter = max(envs[len(envs)-1].Seq, s.lastRemoved[bucket])
	if a := s.ahead[bucket]; a.value > h.counter && time.Since(a.since) >= tailGrace {
		h.counter = a.value // reserved long ago and never committed: abandoned
	}
	if s.ahead[bucket].value <= h.counter {
		s.ahead[bucket] = ahead{}
	}
	s.heads[bucket] = h
}

// updateHeld applies fn to the held message with seq in bucket, if any; fn returns
// false to drop it.
func (s *Store) updateHeld(bucket int, seq int64, fn func(*heldMsg) bool) {
	h := s.heads[bucket]
	if h == nil {
		return
	}
	for i := range h.msgs {
		if h.msgs[i].seq != seq {
			continue
		}
		if !fn(&h.msgs[i]) {
			h.msgs = append(h.msgs[:i], h.msgs[i+1:]...)
			if len(h.msgs) == 0 {
				s.heads[bucket] = nil
			}
		}
		return
	}
}

// forgetHeld drops what this store knows of the buckets' heads: a commit or requeue
// in this process, or the bucket changed hands.
func (s *Store) forgetHeld(buckets ...int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range buckets {
		if b >= 0 && b < len(s.heads) {
			s.heads[b] = nil
		}
	}
}

// HasPending reports whether bucket may hold a message worth a fetch: the idle probe
// ([driver.Prober]) a relay sends for each owned bucket on every poll before it pays
// for a strongly consistent Fetch.
//
// A bucket whose last fetch left every message pending (its head backs off after a
// failed publish, and the rest of the bucket waits behind it or backs off too) is not
// worth a fetch before the earliest due time among those messages (see
// heldHead.earliest: every message counts, not only each key's first, so a relay that
// does not keep key order is woken for a later message of a key too), unless
// something new arrived.
// Until then HasPending answers false: with no request at all when the fetch filled
// its limit (what lies beyond it waits anyway), otherwise with one eventually
// consistent Query of the bucket's sequence counter, which says whether a writer
// reserved a number since. A commit or requeue through this store, and a change of the
// bucket's lease, forget what the fetch saw.
//
// Otherwise it sends one eventually consistent Query of one key: whether the bucket
// holds any message, due or not. A stale answer only delays a fetch to a later poll.
func (s driverStore) HasPending(ctx context.Context, bucket int) (bool, error) {
	if err := s.enter(ctx); err != nil {
		return false, err
	}
	if err := s.checkBucket(bucket); err != nil {
		return false, err
	}
	now := time.Now()
	s.mu.Lock()
	var (
		held    = s.heads[bucket] != nil
		due     time.Time
		full    bool
		counter int64
	)
	if held {
		h := s.heads[bucket]
		due, full, counter = h.earliest(), h.full, h.counter
	}
	s.mu.Unlock()
	if held {
		switch {
		case !due.After(now):
			return true, nil
		case full:
			return false, nil
		}
		c, err := s.readCounter(ctx, bucket)
		if err != nil {
			return false, err
		}
		if c <= counter {
			return false, nil
		}
		s.mu.Lock()
		if s.ahead[bucket].value != c {
			s.ahead[bucket] = ahead{value: c, since: now}
		}
		s.mu.Unlock()
		return true, nil
	}
	out, err := s.client.Query(ctx, &ddb.QueryInput{
		TableName:                 aws.String(s.cfg.TableName),
		KeyConditionExpression:    aws.String("#pk = :pk"),
		ExpressionAttributeNames:  map[string]string{"#pk": s.keys.pk, "#sk": s.keys.sk},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: s.keys.messages(bucket)}},
		ProjectionExpression:      aws.String("#sk"),
		Limit:                     aws.Int32(1),
	})
	if err != nil {
		return false, s.translate(ctx, "probe for pending messages", err)
	}
	return len(out.Items) > 0, nil
}

// readCounter reads a bucket's sequence counter, eventually consistent: the last
// number handed out (0 before the first).
func (s *Store) readCounter(ctx context.Context, bucket int) (int64, error) {
	out, err := s.client.Query(ctx, &ddb.QueryInput{
		TableName:                 aws.String(s.cfg.TableName),
		KeyConditionExpression:    aws.String("#pk = :pk"),
		ExpressionAttributeNames:  map[string]string{"#pk": s.keys.pk, "#seq": attrSequence},
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: s.keys.sequence(bucket)}},
		ProjectionExpression:      aws.String("#seq"),
		Limit:                     aws.Int32(1),
	})
	if err != nil {
		return 0, s.translate(ctx, "read the sequence counter", err)
	}
	if len(out.Items) == 0 {
		return 0, nil
	}
	n, _, err := intAttr(out.Items[0], attrSequence)
	return n, err
}
