package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/outboxkit/outbox"
)

// The store's tables record the bucket count they were migrated for, so that a
// writer, a store or a relay built with another count fails loudly where it runs,
// instead of writing messages to buckets no relay reads.

// Settings names the table, Table+"_settings", that records the store's settings
// (the bucket count).
func (n tableNames) Settings() string { return n.Table + "_settings" }

// settingsTable is Table+"_settings".
func (s *Store) settingsTable() string { return tableNames{Table: s.cfg.Table}.Settings() }

const bucketCountSetting = "bucket_count"

// recordBucketCount records the store's bucket count unless one is recorded, and
// fails with [outbox.ErrMisconfigured] if the recorded count is another.
func (s *Store) recordBucketCount(ctx context.Context, q querier) error {
	record := insertIgnore(s.dialect, s.settingsTable(), "name, value", "?, ?", "name")
	if s.dialect == PostgreSQL {
		record = rebind(record)
	}
	if _, err := q.exec(ctx, record, bucketCountSetting, s.cfg.BucketCount); err != nil {
		return s.wrap(ctx, "record the bucket count", err)
	}
	return s.compareBucketCount(ctx, q)
}

// compareBucketCount reads the recorded bucket count and compares it with the store's.
// No recorded count is no error (tables set up from DDL by hand, before a relay or
// Migrate recorded it).
func (s *Store) compareBucketCount(ctx context.Context, q querier) error {
	read := "SELECT value FROM " + s.settingsTable() + " WHERE name = ?"
	if s.dialect == PostgreSQL {
		read = rebind(read)
	}
	rs, err := q.query(ctx, read, bucketCountSetting)
	if err != nil {
		return s.wrap(ctx, "read the recorded bucket count", err)
	}
	var recorded int64
	found := rs.Next()
	if found {
		err = rs.Scan(&recorded)
	}
	rs.Close()
	if err == nil {
		err = rs.Err()
	}
	switch {
	case err != nil:
		return s.wrap(ctx, "read the recorded bucket count", err)
	case !found:
		return errNoBucketCount
	case recorded != int64(s.cfg.BucketCount):
		return fmt.Errorf("%w: sqlstore: the tables (Config.Table %q) were migrated for %d buckets, but this store is built with Config.BucketCount %d: every writer, store and relay of one table must use one count (drain the table and migrate it again to change it)",
			outbox.ErrMisconfigured, s.cfg.Table, recorded, s.cfg.BucketCount)
	}
	return nil
}

var errNoBucketCount = errors.New("sqlstore: no bucket count recorded")

// bucketCheck remembers, per store, that the writer's bucket count matches the
// recorded one, so only a store's first writes pay the read.
type bucketCheck struct {
	ok atomic.Bool
	// next is when a write looks again after finding no recorded count (unix nanos).
	next atomic.Int64
}

// verifyBuckets runs, on q, before a write: the first write of a store (and, while no
// count is recorded, one write a minute) reads the recorded bucket count, and a
// mismatch fails the write.
func (s *Store) verifyBuckets(ctx context.Context, q querier) error {
	if s.buckets.ok.Load() || time.Now().UnixNano() < s.buckets.next.Load() {
		return nil
	}
	switch err := s.compareBucketCount(ctx, q); {
	case err == nil:
		s.buckets.ok.Store(true)
	case errors.Is(err, errNoBucketCount):
		s.buckets.next.Store(time.Now().Add(time.Minute).UnixNano())
	default:
		return err
	}
	return nil
}
