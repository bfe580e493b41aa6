package sqlstore

import (
	"context"
	"fmt"
	"sort"
	"time"
	"unicode/utf8"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// The lease primitives are conditional UPDATEs (and an INSERT that does nothing on
// a conflict for a row that does not exist yet): the affected-row count says whether
// the condition held, so the database arbitrates between relays.

// ReadCoordination implements [driver.Leaser] with one statement, which every
// dialect runs on one snapshot.
func (s driverStore) ReadCoordination(ctx context.Context) (driver.Coordination, error) {
	var c driver.Coordination
	if err := s.begin(ctx); err != nil {
		return c, err
	}
	rs, err := s.db.query(ctx, s.stmts.readCoordination, s.cfg.BucketCount)
	if err != nil {
		return c, s.wrap(ctx, "read coordination", err)
	}
	defer rs.Close()
	for rs.Next() {
		var kind, bucket, t1, t2, count, pid int64
		var name, host, nonce string
		if err := rs.Scan(&kind, &bucket, &name, &t1, &t2, &count, &host, &pid, &nonce); err != nil {
			return c, s.wrap(ctx, "read coordination", err)
		}
		if kind == 0 {
			if bucket >= 0 {
				c.Leases = append(c.Leases, driver.Lease{Bucket: int(bucket), Owner: name, ExpiresAt: fromMicros(t1)})
			}
			continue
		}
		c.Relays = append(c.Relays, driver.RelayRecord{ID: name, LastSeen: fromMicros(t1), StoppedAt: fromMicros(t2), BucketCount: int(count),
			Instance: driver.Instance{Host: host, PID: int(pid), Nonce: nonce}})
	}
	if err := rs.Err(); err != nil {
		return c, s.wrap(ctx, "read coordination", err)
	}
	sort.Slice(c.Leases, func(i, j int) bool { return c.Leases[i].Bucket < c.Leases[j].Bucket })
	sortRelays(c.Relays)
	return c, nil
}

// ReadRelays implements [driver.Leaser] with one SELECT of the relay table, a row per
// relay; the lease table is not read.
func (s driverStore) ReadRelays(ctx context.Context) ([]driver.RelayRecord, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	rs, err := s.db.query(ctx, s.stmts.readRelays)
	if err != nil {
		return nil, s.wrap(ctx, "read relays", err)
	}
	defer rs.Close()
	var out []driver.RelayRecord
	for rs.Next() {
		var seen, stopped, count, pid int64
		var id, host, nonce string
		if err := rs.Scan(&id, &seen, &stopped, &count, &host, &pid, &nonce); err != nil {
			return nil, s.wrap(ctx, "read relays", err)
		}
		out = append(out, driver.RelayRecord{ID: id, LastSeen: fromMicros(seen), StoppedAt: fromMicros(stopped), BucketCount: int(count),
			Instance: driver.Instance{Host: host, PID: int(pid), Nonce: nonce}})
	}
	if err := rs.Err(); err != nil {
		return nil, s.wrap(ctx, "read relays", err)
	}
	sortRelays(out)
	return out, nil
}

// sortRelays orders records by ID byte-wise in Go rather than with ORDER BY, whose
// order would follow each database's collation.
func sortRelays(rs []driver.RelayRecord) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].ID < rs[j].ID })
}

// Heartbeat implements [driver.Leaser]: LastSeen, the bucket count and the instance
// move together, in one conditional UPDATE (or the INSERT that creates the record).
func (s driverStore) Heartbeat(ctx context.Context, relay string, at time.Time, bucketCount int, instance driver.Instance) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	if err := checkRelayID(relay); err != nil {
		return false, err
	}
	if err := checkInstance(instance); err != nil {
		return false, err
	}
	at64 := micros(at)
	host, pid, nonce := instance.Host, int64(instance.PID), instance.Nonce
	n, err := s.db.exec(ctx, s.stmts.heartbeatUpdate, at64, bucketCount, host, pid, nonce, relay, at64)
	if err != nil || n > 0 {
		return n > 0, s.wrap(ctx, "heartbeat", err)
	}
	// No row moved: either the record is absent (create it) or it is newer (refused).
	n, err = s.db.exec(ctx, s.stmts.heartbeatInsert, relay, at64, bucketCount, host, pid, nonce)
	return n > 0, s.wrap(ctx, "heartbeat", err)
}

// StopRelay implements [driver.Leaser].
func (s driverStore) StopRelay(ctx context.Context, relay string, at time.Time) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := checkRelayID(relay); err != nil {
		return err
	}
	at64 := micros(at)
	n, err := s.db.exec(ctx, s.stmts.stopUpdate, at64, at64, at64, relay)
	if err != nil || n > 0 {
		return s.wrap(ctx, "stop relay", err)
	}
	// MySQL counts an update that changes nothing as 0 rows; the insert then finds
	// the row and does nothing, which is the right outcome too.
	_, err = s.db.exec(ctx, s.stmts.stopInsert, relay, at64, at64)
	return s.wrap(ctx, "stop relay", err)
}

// DeleteRelay implements [driver.Leaser].
func (s driverStore) DeleteRelay(ctx context.Context, relay string, lastSeen time.Time) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	n, err := s.db.exec(ctx, s.stmts.deleteRelay, relay, micros(lastSeen))
	return n > 0, s.wrap(ctx, "delete relay", err)
}

// Claim implements [driver.Leaser].
func (s driverStore) Claim(ctx context.Context, bucket int, owner string, now, expiresAt time.Time) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	if err := checkRelayID(owner); err != nil {
		return false, err
	}
	exp := micros(expiresAt)
	n, err := s.db.exec(ctx, s.stmts.claimUpdate, owner, exp, bucket, micros(now))
	if err != nil || n > 0 {
		return n > 0, s.wrap(ctx, "claim", err)
	}
	// The lease row is created by the first claim; a concurrent creator wins the
	// conflict and this insert affects nothing.
	n, err = s.db.exec(ctx, s.stmts.claimInsert, bucket, owner, exp)
	return n > 0, s.wrap(ctx, "claim", err)
}

// Renew implements [driver.Leaser].
func (s driverStore) Renew(ctx context.Context, held driver.Lease, now, expiresAt time.Time) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	n, err := s.db.exec(ctx, s.stmts.renew, micros(expiresAt), held.Bucket, held.Owner, micros(held.ExpiresAt), micros(now))
	return n > 0, s.wrap(ctx, "renew", err)
}

// Release implements [driver.Leaser].
func (s driverStore) Release(ctx context.Context, held driver.Lease) (bool, error) {
	if err := s.begin(ctx); err != nil {
		return false, err
	}
	n, err := s.db.exec(ctx, s.stmts.release, held.Bucket, held.Owner, micros(held.ExpiresAt))
	return n > 0, s.wrap(ctx, "release", err)
}

// maxRelayID is the width of the owner and relay id columns, in characters.
const maxRelayID = 255

// checkRelayID refuses ids the columns cannot hold exactly: an empty owner would read
// as a free lease, and a long one could be cut short and collide with another.
func checkRelayID(id string) error {
	if id == "" || utf8.RuneCountInString(id) > maxRelayID {
		return fmt.Errorf("%w: sqlstore: relay id %q must be 1 to %d characters", outbox.ErrMisconfigured, id, maxRelayID)
	}
	return nil
}

// checkInstance refuses an instance the columns cannot hold exactly.
func checkInstance(i driver.Instance) error {
	if len(i.Host) > driver.MaxInstanceHost || len(i.Nonce) > driver.MaxInstanceNonce {
		return fmt.Errorf("%w: sqlstore: relay instance host (%d bytes) or nonce (%d bytes) is longer than %d or %d bytes",
			outbox.ErrMisconfigured, len(i.Host), len(i.Nonce), driver.MaxInstanceHost, driver.MaxInstanceNonce)
	}
	return nil
}

// CheckRelayID implements [driver.RelayIDChecker]: 1 to 255 characters.
func (s driverStore) CheckRelayID(id string) error { return checkRelayID(id) }
