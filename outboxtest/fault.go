package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox/driver"
)

// ErrInjected is the cause of every failure a [FaultTransport] makes up. The failures
// are transient: retrying can succeed.
var ErrInjected = errors.New("outboxtest: injected fault")

// ErrOutage is the error a [FaultTransport] returns for a whole batch during an
// outage. It wraps [ErrInjected].
var ErrOutage = fmt.Errorf("%w: broker unavailable", ErrInjected)

// Faults says which faults a [FaultTransport] injects. The zero value injects none.
type Faults struct {
	// MessageErrorRate is the probability, from 0 to 1, that one message of a batch
	// fails transiently. Failed messages are not passed on; the others are, and the
	// failures are reported in an [*driver.PublishError].
	MessageErrorRate float64
	// BatchErrorRate is the probability, from 0 to 1, that a whole Publish call fails
	// with [ErrInjected] before anything is passed on.
	BatchErrorRate float64
	// Latency is added before every Publish call, plus a random extra of up to Jitter.
	Latency time.Duration
	Jitter  time.Duration
	// OutageStart and OutageEnd, when OutageEnd is after OutageStart, make every
	// Publish call between the two (by Now) fail with [ErrOutage].
	OutageStart, OutageEnd time.Time
	// Seed seeds the random choices, so a run that publishes the same batches in the
	// same order injects the same faults. Defaults to 1.
	Seed uint64
	// Now is the clock for the outage window. Defaults to time.Now.
	Now func() time.Time
}

// Validate reports the first setting that cannot work, naming its field.
func (f Faults) Validate() error {
	if f.MessageErrorRate < 0 || f.MessageErrorRate > 1 {
		return fmt.Errorf("outboxtest: Faults.MessageErrorRate %v is outside 0..1", f.MessageErrorRate)
	}
	if f.BatchErrorRate < 0 || f.BatchErrorRate > 1 {
		return fmt.Errorf("outboxtest: Faults.BatchErrorRate %v is outside 0..1", f.BatchErrorRate)
	}
	if f.Latency < 0 || f.Jitter < 0 {
		return fmt.Errorf("outboxtest: Faults.Latency and Faults.Jitter must not be negative")
	}
	return nil
}

// FaultTransport wraps a transport and injects faults into its publishes: transient
// per-message and per-batch errors, latency, and outages (a time window, or a switch
// the test flips with [FaultTransport.SetDown]). Use it to prove that a dispatcher
// retries, keeps per-key order under failures, and loses nothing.
//
// A FaultTransport is safe for concurrent use. Its random choices come from one seeded
// source, so they repeat exactly when the publishes arrive in the same order.
type FaultTransport struct {
	next   driver.Transport
	faults Faults

	down     atomic.Bool
	mu       sync.Mutex
	rng      *rand.Rand
	injected int
}

var _ driver.Transport = (*FaultTransport)(nil)

// NewFaultTransport wraps next. It returns an error naming the bad field when faults
// does not validate.
func NewFaultTransport(next driver.Transport, faults Faults) (*FaultTransport, error) {
	if next == nil {
		return nil, errors.New("outboxtest: NewFaultTransport needs a transport to wrap")
	}
	if err := faults.Validate(); err != nil {
		return nil, err
	}
	if faults.Seed == 0 {
		faults.Seed = 1
	}
	if faults.Now == nil {
		faults.Now = time.Now
	}
	return &FaultTransport{
		next:   next,
		faults: faults,
		rng:    rand.New(rand.NewPCG(faults.Seed, faults.Seed^0x9e3779b97f4a7c15)),
	}, nil
}

// SetDown turns an outage on or off: while down, every Publish fails with
// [ErrOutage] and nothing is passed on.
func (f *FaultTransport) SetDown(down bool) { f.down.Store(down) }

// Injected is the number of failures injected so far: one per failed message, and one
// per failed batch.
func (f *FaultTransport) Injected() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.injected
}

// Publish injects the configured faults and passes the rest of the batch on.
func (f *FaultTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	delay := f.faults.Latency
	if f.faults.Jitter > 0 {
		delay += time.Duration(f.rng.Int64N(int64(f.faults.Jitter) + 1))
	}
	f.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if f.outage() {
		f.mu.Lock()
		f.injected++
		f.mu.Unlock()
		return ErrOutage
	}

	f.mu.Lock()
	if f.faults.BatchErrorRate > 0 && f.rng.Float64() < f.faults.BatchErrorRate {
		f.injected++
		f.mu.Unlock()
		return fmt.Errorf("%w: batch of %d failed", ErrInjected, len(batch))
	}
	pass := batch
	var failed []driver.MessageError
	if f.faults.MessageErrorRate > 0 {
		pass = make([]*driver.Envelope, 0, len(batch))
		for _, env := range batch {
			if f.rng.Float64() < f.faults.MessageErrorRate {
				failed = append(failed, driver.MessageError{ID: env.ID, Err: ErrInjected})
				continue
			}
			pass = append(pass, env)
		}
		f.injected += len(failed)
	}
	f.mu.Unlock()

	var err error
	if len(pass) > 0 {
		err = f.next.Publish(ctx, pass)
	}
	if failed == nil {
		return err
	}
	if err == nil {
		return &driver.PublishError{Failed: failed}
	}
	var pe *driver.PublishError
	if errors.As(err, &pe) {
		return &driver.PublishError{Failed: append(failed, pe.Failed...)}
	}
	// The wrapped transport failed the whole call: nothing may be assumed sent.
	return err
}

func (f *FaultTransport) outage() bool {
	if f.down.Load() {
		return true
	}
	if !f.faults.OutageEnd.After(f.faults.OutageStart) {
		return false
	}
	now := f.faults.Now()
	return !now.Before(f.faults.OutageStart) && now.Before(f.faults.OutageEnd)
}
