package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"
)

// session is one contender's run: its instance, its broker and its relays.
type session struct {
	run    *run
	in     instance
	relays []runningRelay
}

func open(ctx context.Context, e *env, c contender) (*session, error) {
	sfx := suffix()
	topic := "bench-" + sfx
	b, err := newBroker(topic)
	if err != nil {
		return nil, err
	}
	r := &run{env: e, broker: b, sfx: sfx, topic: topic}
	in, err := c.open(ctx, r)
	if err != nil {
		if in != nil {
			_ = in.close(context.WithoutCancel(ctx))
		}
		b.close()
		return nil, fmt.Errorf("%s: %w", c.name, err)
	}
	return &session{run: r, in: in}, nil
}

func (s *session) startRelays(ctx context.Context, n, batch int) error {
	for range n {
		r, err := s.in.relay(ctx, batch)
		if err != nil {
			return err
		}
		s.relays = append(s.relays, r)
	}
	return nil
}

// waitHeld waits until the relays hold every bucket between them, each at least
// its fair share (relays without leases are ready at once).
func (s *session) waitHeld(buckets int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		total, fair := 0, true
		for _, r := range s.relays {
			h := r.held()
			if h < 0 {
				return nil
			}
			total += h
			fair = fair && h >= buckets/len(s.relays)
		}
		if total >= buckets && fair {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the relays hold %d of %d buckets after %v", total, buckets, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitReady waits until the relays hold every bucket between them (waitHeld) and,
// for a contender that reads a stream, until one of them reads it.
func (s *session) waitReady(ctx context.Context, buckets int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	if err := s.waitHeld(buckets, timeout); err != nil {
		return err
	}
	st, ok := s.in.(streamingInstance)
	if !ok {
		return nil
	}
	for {
		on, err := st.streaming(ctx)
		if err != nil {
			return err
		}
		if on {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no relay reads the stream after %v", timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *session) stopRelays(ctx context.Context) error {
	var errs []error
	for _, r := range s.relays {
		errs = append(errs, r.stop(ctx))
	}
	s.relays = nil
	return errors.Join(errs...)
}

func (s *session) close(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx) // an interrupted run still drops its tables
	err := errors.Join(s.stopRelays(ctx), s.in.close(ctx))
	s.run.broker.close()
	return err
}

// deliver relays everything the writers sent and checks it arrived as sent.
func (s *session) deliver(ctx context.Context, p *plan, batch int) (check, error) {
	col, err := s.run.broker.collect(p, false)
	if err != nil {
		return check{}, err
	}
	if err := s.startRelays(ctx, 1, batch); err != nil {
		return check{}, errors.Join(err, col.finish(ctx))
	}
	return s.settle(ctx, col, p.total())
}

// settle waits for n messages, stops the relays, reads the topic to its end and
// checks what arrived.
func (s *session) settle(ctx context.Context, col *collector, n int) (check, error) {
	waitErr := col.waitFor(n, time.Minute+time.Duration(n)*time.Millisecond)
	err := errors.Join(s.stopRelays(ctx), col.finish(ctx))
	ch := col.check()
	if waitErr != nil {
		say("  %v", waitErr)
	}
	return ch, errors.Join(err, ch.err())
}

// checks adds up the delivery checks of a contender's runs in one scenario.
type checks struct {
	Runs int
	check
}

func (c *checks) add(ch check) {
	c.Runs++
	c.Sent += ch.Sent
	c.Received += ch.Received
	c.Missing += ch.Missing
	c.Duplicates += ch.Duplicates
	c.Reordered += ch.Reordered
	c.Corrupt += ch.Corrupt
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile of sorted durations, nearest rank.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
