package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/lifecycle"
)

// streamer is the service that reads a store's stream ([driver.Streamer]), for a
// store whose fast path writes no rows (the SQL store's log mode). One relay of a
// fleet reads: the one holding [driver.StreamLease] in the store's lease table. It
// publishes each batch through the transport in per-key order and confirms the
// stream's position only once every envelope of the batch is settled: acknowledged
// by the broker, or written to the store's table (the table lane), where the drainer
// of the bucket's owner retries, backs off and parks it as any other.
//
// An envelope whose publish keeps failing for Config.StreamRetryBudget goes to the
// table lane, and so does every later envelope of its key while the table holds a
// pending envelope of the key: the key is held. The streamer reads which keys the
// table holds when it takes the stream, and watches the keys it holds until their
// envelopes are gone from the table (published, or parked: a parked envelope does not
// hold its key back, as in the table).
type streamer struct {
	cfg       *Config
	log       *slog.Logger
	store     deadlined
	source    driver.Streamer
	finder    driver.Finder
	admin     driver.Admin
	transport driver.Transport
	meter     *meter
	// sameKeyBatches: the transport keeps key order within one Publish call.
	sameKeyBatches bool

	lease    driver.Lease
	renewed  time.Time
	held     map[string][]uuid.UUID // key → its pending envelopes in the table, oldest first
	watched  time.Time              // last look at the held keys
	diverted atomic.Int64
	// divertLog rate-limits the warnings of writes to the table lane.
	divertLog warnLimit
}

// newStreamer returns the stream service, or nil if the store has no stream. The
// table lane needs the store to find envelopes by ID and list the pending ones.
func newStreamer(store driver.Store, bounded deadlined, transport driver.Transport, cfg *Config, log *slog.Logger, m *meter) (*streamer, error) {
	source, ok := store.(driver.Streamer)
	if !ok {
		return nil, nil
	}
	finder, fok := store.(driver.Finder)
	admin, aok := store.(driver.Admin)
	if !fok || !aok {
		return nil, fmt.Errorf("%w: relay: the store has a stream (driver.Streamer) but its table lane needs driver.Finder and driver.Admin", outbox.ErrMisconfigured)
	}
	s := &streamer{cfg: cfg, log: log, store: bounded, source: source, finder: finder, admin: admin, transport: transport, meter: m}
	if k, ok := transport.(driver.KeyOrderKeeper); ok {
		s.sameKeyBatches = k.KeepsKeyOrder()
	}
	return s, nil
}

// errStreamLeaseLost: the stream lease could not be renewed; another relay may read.
var errStreamLeaseLost = errors.New("relay: the stream lease was lost")

// loop takes the stream lease when it is free and reads while it holds it, until
// asked to stop. It returns an error only for what stops the worker (fatal).
func (s *streamer) loop(r lifecycle.Run) error {
	for !r.Stopped() {
		ok, err := s.claim(r.Work)
		if err != nil && fatal(err) {
			return err
		}
		if err != nil && r.Work.Err() == nil {
			s.log.Warn("relay: claiming the stream lease failed", "error", err)
		}
		if !ok {
			r.Sleep(s.cfg.PollInterval)
			continue
		}
		err = s.read(r)
		if r.Final.Err() == nil {
			s.release(r.Final)
		}
		switch {
		case err == nil:
		case fatal(err):
			return err
		case r.Work.Err() == nil && !errors.Is(err, errStreamLeaseLost):
			s.log.Warn("relay: reading the stream failed; it is opened again", "error", err)
			r.Sleep(s.cfg.PollInterval)
		}
	}
	return nil
}

// claim takes the stream lease if it is free.
func (s *streamer) claim(ctx context.Context) (bool, error) {
	now := s.cfg.now().Truncate(time.Microsecond)
	exp := now.Add(s.cfg.LeaseDuration)
	ok, err := s.store.Claim(ctx, driver.StreamLease, s.cfg.RelayID, now, exp)
	if err != nil || !ok {
		return false, err
	}
	s.lease = driver.Lease{Bucket: driver.StreamLease, Owner: s.cfg.RelayID, ExpiresAt: exp}
	s.renewed = now
	s.log.Info("relay: took the stream lease; reading the stream")
	return true, nil
}

// renew renews the stream lease when due; false when it was lost.
func (s *streamer) renew(ctx context.Context) (bool, error) {
	now := s.cfg.now().Truncate(time.Microsecond)
	if now.Sub(s.renewed) < s.cfg.LeaseRenewInterval {
		return s.valid(now), nil
	}
	exp := now.Add(s.cfg.LeaseDuration)
	ok, err := s.store.Renew(ctx, s.lease, now, exp)
	if err != nil {
		// The lease may still be valid: try again at the next look.
		return s.valid(now), err
	}
	if !ok {
		s.meter.refuse(ctx, "renew stream lease")
		return false, nil
	}
	s.lease.ExpiresAt, s.renewed = exp, now
	return true, nil
}

// valid reports whether the lease covers work starting at now.
func (s *streamer) valid(now time.Time) bool {
	return now.Before(s.lease.ExpiresAt.Add(-s.cfg.margin()))
}

// release hands the stream lease back, so a standby takes the stream at its next
// look instead of after LeaseDuration.
func (s *streamer) release(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.releaseBound())
	defer cancel()
	if _, err := s.store.Release(ctx, s.lease); err != nil {
		s.log.Warn("relay: releasing the stream lease failed; it lapses after LeaseDuration", "error", err)
	}
}

// read reads the stream while the lease holds and no stop was asked for.
func (s *streamer) read(r lifecycle.Run) error {
	ctx := r.Work
	st, err := s.source.OpenStream(ctx)
	if err != nil {
		return fmt.Errorf("relay: open the stream: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(r.Final, s.cfg.releaseBound())
		defer cancel()
		_ = st.Close(cctx)
	}()
	if err := s.loadHeld(ctx); err != nil {
		return err
	}
	// Next returns when a stop is asked for; a publish under way finishes first.
	next, cancel := context.WithCancel(ctx)
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		select {
		case <-r.Stopping():
			cancel()
		case <-next.Done():
		}
	}()
	defer func() {
		cancel()
		<-watching
	}()
	for !r.Stopped() {
		ok, err := s.renew(ctx)
		if err != nil && ctx.Err() == nil {
			s.log.Warn("relay: renewing the stream lease failed", "error", err)
		}
		if !ok {
			s.log.Warn("relay: lost the stream lease; stopped reading the stream")
			return errStreamLeaseLost
		}
		s.watchHeld(ctx)
		envs, pos, err := st.Next(next)
		if err != nil {
			if r.Stopped() {
				return nil
			}
			return err
		}
		if len(envs) == 0 {
			continue
		}
		s.watchHeld(ctx) // a key let go of since the last look streams again at once
		for _, env := range envs {
			if err := checkEnvelope(env, s.cfg.BucketCount); err != nil {
				return err
			}
		}
		settled, err := s.settle(r, envs)
		if err != nil || !settled {
			return err // not confirmed: the next reader reads the batch again
		}
		if err := st.Confirm(ctx, pos); err != nil {
			return err
		}
	}
	return nil
}

// Retries in place back off from streamRetryFirst, doubling, up to streamRetryMax.
const (
	streamRetryFirst = 50 * time.Millisecond
	streamRetryMax   = time.Second
)

// settle publishes envs in per-key order and moves what keeps failing to the table
// lane. It reports false, with no error, when a stop or the lease's end cut it short.
func (s *streamer) settle(r lifecycle.Run, envs []*driver.Envelope) (bool, error) {
	ctx := r.Work
	var toTable, pending []*driver.Envelope
	for _, e := range envs {
		if e.Key != nil && s.held[string(e.Key)] != nil {
			toTable = append(toTable, e)
		} else {
			pending = append(pending, e)
		}
	}
	budget := s.cfg.now().Add(s.cfg.StreamRetryBudget)
	wait := streamRetryFirst
	causes := map[uuid.UUID]error{}
	for len(pending) > 0 {
		failed, permanent, err := s.publish(ctx, pending, causes)
		if errors.Is(err, errStreamLeaseLost) {
			return false, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return false, nil
			}
			return false, err
		}
		pending = failed
		if permanent {
			// A permanent failure goes to the table lane at once (parked there), and
			// so do the later messages of its key; the rest keep their budget.
			var now []*driver.Envelope
			now, pending = splitPermanent(pending, causes)
			toTable = mergeInOrder(envs, toTable, now)
		}
		if len(pending) == 0 || !s.cfg.now().Before(budget) {
			break
		}
		if !r.Sleep(wait) {
			return false, nil
		}
		if ok, _ := s.renew(ctx); !ok {
			return false, nil // not confirmed: the next reader reads the batch again
		}
		wait = min(2*wait, streamRetryMax)
	}
	if len(pending) > 0 {
		toTable = mergeInOrder(envs, toTable, pending)
	}
	return true, s.divert(ctx, toTable, causes)
}

// publish publishes envs once in per-key order (waves of one envelope per key, unless
// the transport keeps key order in a batch) and returns, in order, those that failed
// or were held back behind a failure of their key.
//
// Each wave renews the lease when due and may take what is left of it; a lease that
// lapses ends the call with errStreamLeaseLost.
func (s *streamer) publish(ctx context.Context, envs []*driver.Envelope, causes map[uuid.UUID]error) (failed []*driver.Envelope, permanent bool, err error) {
	failedKeys := map[string]bool{}
	back := map[uuid.UUID]bool{}
	// Waves go out BatchSize envelopes at a time, as the drainer's batches do.
	var chunks [][]*driver.Envelope
	for _, wave := range s.waves(envs) {
		for len(wave) > s.cfg.BatchSize {
			chunks = append(chunks, wave[:s.cfg.BatchSize])
			wave = wave[s.cfg.BatchSize:]
		}
		chunks = append(chunks, wave)
	}
	for _, wave := range chunks {
		wave = slices.DeleteFunc(slices.Clone(wave), func(e *driver.Envelope) bool {
			if e.Key != nil && failedKeys[string(e.Key)] {
				back[e.ID] = true
				return true
			}
			return false
		})
		if len(wave) == 0 {
			continue
		}
		if ok, err := s.renew(ctx); err != nil && !ok {
			return nil, false, err
		} else if !ok {
			return nil, false, errStreamLeaseLost
		}
		left := s.lease.ExpiresAt.Add(-s.cfg.margin()).Sub(s.cfg.now())
		if left <= 0 {
			return nil, false, errStreamLeaseLost
		}
		pctx, cancel := context.WithTimeout(ctx, left)
		start := time.Now()
		perr := s.transport.Publish(pctx, wave)
		took := time.Since(start)
		cancel()
		if perr != nil && ctx.Err() != nil {
			s.meter.abandoned(ctx, wave, start, took, perr)
			return nil, false, ctx.Err()
		}
		bad := failures(wave, perr)
		acked := make([]*driver.Envelope, 0, len(wave))
		for _, e := range wave {
			if cause, ok := bad[e.ID]; ok {
				back[e.ID] = true
				causes[e.ID] = cause
				permanent = permanent || driver.IsPermanent(cause)
				if e.Key != nil {
					failedKeys[string(e.Key)] = true
				}
				continue
			}
			acked = append(acked, e)
		}
		s.meter.obs.Published(ctx, wave, acked, start, took, perr)
		s.meter.completed(ctx, acked)
	}
	for _, e := range envs {
		if back[e.ID] {
			failed = append(failed, e)
		}
	}
	return failed, permanent, nil
}

// splitPermanent splits failed envelopes (in order) into those that failed
// permanently with the later ones of their keys, and the rest. A key keeps its order:
// once one of its envelopes stays, every later one stays too.
func splitPermanent(failed []*driver.Envelope, causes map[uuid.UUID]error) (permanent, rest []*driver.Envelope) {
	gone, stays := map[string]bool{}, map[string]bool{}
	for _, e := range failed {
		k := string(e.Key)
		cause, ok := causes[e.ID]
		switch {
		case e.Key != nil && stays[k]:
			rest = append(rest, e)
		case ok && driver.IsPermanent(cause), e.Key != nil && gone[k]:
			gone[k] = e.Key != nil
			permanent = append(permanent, e)
		default:
			stays[k] = e.Key != nil
			rest = append(rest, e)
		}
	}
	return permanent, rest
}

// waves splits envs as the drainer does: wave i holds each key's i-th envelope.
func (s *streamer) waves(envs []*driver.Envelope) [][]*driver.Envelope {
	return keyWaves(envs, s.cfg.Unordered || s.sameKeyBatches)
}

// mergeInOrder returns the envelopes of a and b in their order in all.
func mergeInOrder(all, a, b []*driver.Envelope) []*driver.Envelope {
	in := make(map[*driver.Envelope]bool, len(a)+len(b))
	for _, e := range a {
		in[e] = true
	}
	for _, e := range b {
		in[e] = true
	}
	out := make([]*driver.Envelope, 0, len(in))
	for _, e := range all {
		if in[e] {
			out = append(out, e)
		}
	}
	return out
}

// divert writes envs into the table lane, in order, in one transaction: the first
// failure of each key with its attempt recorded (a permanent one parked), the rest
// fresh, held behind it. Their keys are held.
func (s *streamer) divert(ctx context.Context, envs []*driver.Envelope, causes map[uuid.UUID]error) error {
	if len(envs) == 0 {
		return nil
	}
	now := s.cfg.now()
	out := make([]*driver.Envelope, len(envs))
	for i, e := range envs {
		c := *e
		if cause, ok := causes[e.ID]; ok {
			c.Attempts, c.LastError = 1, cause.Error()
			if driver.IsPermanent(cause) {
				c.Status = driver.Parked
			} else {
				c.NextAttemptAt = now.Add(s.cfg.backoff(1))
			}
		}
		out[i] = &c
	}
	err := s.store.Enqueue(ctx, out...)
	if errors.Is(err, outbox.ErrInvalidMessage) && len(out) > 1 {
		// Read again after a crash: some are in the table already. One at a time,
		// keeping what is there.
		err = nil
		for _, e := range out {
			if eerr := s.store.Enqueue(ctx, e); eerr != nil && !errors.Is(eerr, outbox.ErrInvalidMessage) {
				err = eerr
				break
			}
		}
	} else if errors.Is(err, outbox.ErrInvalidMessage) {
		err = nil // in the table already
	}
	if err != nil {
		return fmt.Errorf("relay: write to the table lane: %w", err)
	}
	for _, e := range out {
		s.diverted.Add(1)
		if e.Status == driver.Parked {
			s.meter.park(ctx, e, true, e.LastError)
			continue
		}
		if e.Key != nil {
			s.held[string(e.Key)] = append(s.held[string(e.Key)], e.ID)
		}
	}
	s.logDiverted(len(out))
	return nil
}

// logDiverted logs a write to the table lane: at WARN at most once per
// LeaseRenewInterval, with the number of writes logged at DEBUG since the previous
// warning (while a key is held, every batch holding one of its messages is such a
// write: through a broker outage, every batch); at DEBUG otherwise.
func (s *streamer) logDiverted(n int) {
	const msg = "relay: messages the broker kept refusing went to the table lane; their keys follow them there until it is drained"
	attrs := []any{"messages", n, "keys_held", len(s.held)}
	if warn, suppressed := s.divertLog.next(s.cfg.now(), s.cfg.LeaseRenewInterval); warn {
		s.log.Warn(msg, append(attrs, "suppressed", suppressed)...)
		return
	}
	s.log.Debug(msg, attrs...)
}

// loadHeld reads the keys the table holds pending envelopes of, when the stream is
// taken: a key with an envelope in the table goes on there.
func (s *streamer) loadHeld(ctx context.Context) error {
	s.held = map[string][]uuid.UUID{}
	var after driver.Cursor
	for {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		envs, err := s.admin.List(lctx, driver.Pending, after, 1000)
		cancel()
		if err != nil {
			return fmt.Errorf("relay: read the table lane's keys: %w", err)
		}
		for _, e := range envs {
			if e.Key != nil {
				s.held[string(e.Key)] = append(s.held[string(e.Key)], e.ID)
			}
		}
		if len(envs) < 1000 {
			break
		}
		after = driver.After(envs[len(envs)-1])
	}
	s.watched = s.cfg.now()
	return nil
}

// watchHeld lets go, every PollInterval, of the keys whose envelopes are gone from the
// table or parked. It looks at each key's oldest envelope, at most a few hundred
// lookups a time.
func (s *streamer) watchHeld(ctx context.Context) {
	now := s.cfg.now()
	if len(s.held) == 0 || now.Sub(s.watched) < s.cfg.PollInterval {
		return
	}
	s.watched = now
	budget := 256
	for key, ids := range s.held {
		for len(ids) > 0 && budget > 0 {
			budget--
			fctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
			env, err := s.finder.Find(fctx, ids[0])
			cancel()
			if err != nil && !errors.Is(err, driver.ErrNotFound) {
				return // the store is not answering: look again later
			}
			if err == nil && env.Status == driver.Pending {
				break
			}
			ids = ids[1:]
		}
		if len(ids) == 0 {
			delete(s.held, key)
		} else {
			s.held[key] = ids
		}
	}
}
