package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxkit/outbox/driver"
)

// deadlined gives every store call the relay makes a deadline of StoreTimeout
// (LeaseRenewInterval, 10 s, by default). A connection that hangs without being reset
// (a black-holed network path keeps a TCP read waiting for minutes) then fails the
// call instead of wedging the relay: the round or drain reports the error, backs off
// and tries again, and recovers by itself once the store answers. A round that cannot
// finish in time leaves its leases to lapse, as a crash would, so peers take over.
type deadlined struct {
	driver.Store
	timeout time.Duration
}

// bound derives a call's context.
func (s deadlined) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// wrap names a deadline the call hit (and not its caller's).
func (s deadlined) wrap(ctx context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("relay: store call took longer than %s: %w", s.timeout, err)
	}
	return err
}

func call[T any](s deadlined, ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	cctx, cancel := s.bound(ctx)
	defer cancel()
	v, err := f(cctx)
	return v, s.wrap(ctx, err)
}

func call0(s deadlined, ctx context.Context, f func(context.Context) error) error {
	_, err := call(s, ctx, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) })
	return err
}

func (s deadlined) Check(ctx context.Context) error {
	return call0(s, ctx, s.Store.Check)
}

func (s deadlined) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	return call(s, ctx, func(ctx context.Context) (driver.Batch, error) {
		return s.Store.Fetch(ctx, bucket, limit)
	})
}

func (s deadlined) Complete(ctx context.Context, envs []*driver.Envelope) error {
	return call0(s, ctx, func(ctx context.Context) error { return s.Store.Complete(ctx, envs) })
}

func (s deadlined) Reschedule(ctx context.Context, env *driver.Envelope, next time.Time, cause string) error {
	return call0(s, ctx, func(ctx context.Context) error { return s.Store.Reschedule(ctx, env, next, cause) })
}

func (s deadlined) Park(ctx context.Context, env *driver.Envelope, cause string) error {
	return call0(s, ctx, func(ctx context.Context) error { return s.Store.Park(ctx, env, cause) })
}

func (s deadlined) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	return call(s, ctx, s.Store.ReadCoordination)
}

func (s deadlined) ReadRelays(ctx context.Context) ([]driver.RelayRecord, error) {
	return call(s, ctx, s.Store.ReadRelays)
}

func (s deadlined) Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int, instance driver.Instance) (bool, error) {
	return call(s, ctx, func(ctx context.Context) (bool, error) {
		return s.Store.Heartbeat(ctx, relay, at, bucketCount, instance)
	})
}

func (s deadlined) StopRelay(ctx context.Context, relay string, at time.Time) error {
	return call0(s, ctx, func(ctx context.Context) error { return s.Store.StopRelay(ctx, relay, at) })
}

func (s deadlined) DeleteRelay(ctx context.Context, relay string, lastSeen time.Time) (bool, error) {
	return call(s, ctx, func(ctx context.Context) (bool, error) { return s.Store.DeleteRelay(ctx, relay, lastSeen) })
}

func (s deadlined) Claim(ctx context.Context, bucket int, owner string, now, expiresAt time.Time) (bool, error) {
	return call(s, ctx, func(ctx context.Context) (bool, error) {
		return s.Store.Claim(ctx, bucket, owner, now, expiresAt)
	})
}

func (s deadlined) Renew(ctx context.Context, held driver.Lease, now, expiresAt time.Time) (bool, error) {
	return call(s, ctx, func(ctx context.Context) (bool, error) { return s.Store.Renew(ctx, held, now, expiresAt) })
}

func (s deadlined) Release(ctx context.Context, held driver.Lease) (bool, error) {
	return call(s, ctx, func(ctx context.Context) (bool, error) { return s.Store.Release(ctx, held) })
}

// The optional capabilities, each bounded the same way.

type deadlinedFinder struct {
	deadlined
	f driver.Finder
}

func (s deadlinedFinder) Find(ctx context.Context, id uuid.UUID) (*driver.Envelope, error) {
	return call(s.deadlined, ctx, func(ctx context.Context) (*driver.Envelope, error) { return s.f.Find(ctx, id) })
}

type deadlinedProber struct {
	deadlined
	p driver.Prober
}

func (s deadlinedProber) HasPending(ctx context.Context, bucket int) (bool, error) {
	return call(s.deadlined, ctx, func(ctx context.Context) (bool, error) { return s.p.HasPending(ctx, bucket) })
}

type deadlinedRetainer struct {
	deadlined
	r driver.Retainer
}

func (s deadlinedRetainer) MarkDispatched(ctx context.Context, envs []*driver.Envelope, at time.Time) error {
	return call0(s.deadlined, ctx, func(ctx context.Context) error { return s.r.MarkDispatched(ctx, envs, at) })
}

func (s deadlinedRetainer) DeleteDispatched(ctx context.Context, before time.Time, limit int) (int, error) {
	return call(s.deadlined, ctx, func(ctx context.Context) (int, error) { return s.r.DeleteDispatched(ctx, before, limit) })
}
