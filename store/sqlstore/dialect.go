package sqlstore

import (
	"strconv"
	"strings"

	"github.com/outboxkit/outbox/store/sqlstore/internal/hooks"
)

// Column order shared by every SELECT of messages and by scanEnvelope.
const selectColumns = "seq, id, bucket, bucket_count, topic, msg_key, payload, headers, part, flags, created_at, attempts, next_attempt_at, status, last_error, dispatched_at"

// insertColumns are the columns Enqueue writes; seq comes from the identity column.
const insertColumns = "id, bucket, bucket_count, topic, msg_key, payload, headers, part, flags, created_at, attempts, next_attempt_at, status, last_error"

const insertColumnCount = 14

// instanceColumns are the relay table's columns of the instance that wrote the last
// heartbeat (driver.Instance), added by migration 5.
const instanceColumns = "instance_host, instance_pid, instance_nonce"

// freshColumns are those of an envelope that has never been attempted: the rest
// take their defaults (last_error stays, as MySQL gives a TEXT column no default).
const (
	freshColumns     = "id, bucket, bucket_count, topic, msg_key, payload, headers, part, flags, created_at, last_error"
	freshColumnCount = 11
)

// Bind-parameter ceilings: PostgreSQL and MySQL take 65535 per statement, SQLite
// 32766. A batch larger than maxRows(d) is written as several statements in one
// transaction.
func maxParams(d Dialect) int {
	if d == SQLite {
		return 32766
	}
	return 65535
}

func maxRows(d Dialect) int {
	if n := hooks.RowsPerStatement.Load(); n > 0 { // set by tests only
		return int(n)
	}
	return maxParams(d) / insertColumnCount
}

// statements holds every fixed statement, rendered once for the configured tables.
// Placeholders are written as '?' and rebound to $n for PostgreSQL.
type statements struct {
	fetch, find, list                    string
	reschedule, park                     string
	deleteDispatched                     string
	statsPending, statsHead, statsParked string
	claimUpdate, claimInsert             string
	renew, release                       string
	heartbeatUpdate, heartbeatInsert     string
	stopUpdate, stopInsert, deleteRelay  string
	readCoordination, readRelays         string
}

func newStatements(d Dialect, c Config) statements {
	m, l, r := c.Table, c.LeaseTable, c.RelayTable
	var s statements
	s.fetch = "SELECT " + selectColumns + " FROM " + m + " WHERE status = 0 AND bucket = ? ORDER BY seq LIMIT ?"
	s.find = "SELECT " + selectColumns + " FROM " + m + " WHERE id = ? ORDER BY seq LIMIT 1"
	s.list = "SELECT " + selectColumns + " FROM " + m + " WHERE status = ? AND (bucket > ? OR (bucket = ? AND seq > ?)) ORDER BY bucket, seq LIMIT ?"
	s.reschedule = "UPDATE " + m + " SET attempts = attempts + 1, next_attempt_at = ?, last_error = ? WHERE id = ? AND status = 0"
	s.park = "UPDATE " + m + " SET attempts = attempts + 1, status = 1, dispatched_at = 0, last_error = ? WHERE id = ? AND status = 0"
	if d == MySQL {
		// MySQL refuses LIMIT inside IN (subquery) but takes it on a single-table DELETE.
		s.deleteDispatched = "DELETE FROM " + m + " WHERE status = 2 AND dispatched_at < ? ORDER BY seq LIMIT ?"
	} else {
		s.deleteDispatched = "DELETE FROM " + m + " WHERE id IN (SELECT id FROM " + m + " WHERE status = 2 AND dispatched_at < ? LIMIT ?)"
	}
	s.statsPending = "SELECT COUNT(*) FROM (SELECT 1 AS one FROM " + m + " WHERE status = 0 AND bucket = ? LIMIT ?) capped"
	s.statsHead = "SELECT created_at FROM " + m + " WHERE status = 0 AND bucket = ? ORDER BY seq LIMIT 1"
	s.statsParked = "SELECT COUNT(*) FROM (SELECT 1 AS one FROM " + m + " WHERE status = 1 LIMIT ?) capped"

	s.claimUpdate = "UPDATE " + l + " SET owner = ?, expires_at = ? WHERE bucket = ? AND (owner = '' OR expires_at <= ?)"
	s.claimInsert = insertIgnore(d, l, "bucket, owner, expires_at", "?, ?, ?", "bucket")
	s.renew = "UPDATE " + l + " SET expires_at = ? WHERE bucket = ? AND owner = ? AND expires_at = ? AND expires_at > ?"
	s.release = "UPDATE " + l + " SET owner = '' WHERE bucket = ? AND owner = ? AND expires_at = ?"
	s.heartbeatUpdate = "UPDATE " + r + " SET last_seen = ?, stopped_at = 0, bucket_count = ?, instance_host = ?, instance_pid = ?, instance_nonce = ? WHERE id = ? AND last_seen < ?"
	s.heartbeatInsert = insertIgnore(d, r, "id, last_seen, stopped_at, bucket_count, "+instanceColumns, "?, ?, 0, ?, ?, ?, ?", "id")
	s.stopUpdate = "UPDATE " + r + " SET last_seen = CASE WHEN last_seen < ? THEN ? ELSE last_seen END, stopped_at = ? WHERE id = ?"
	s.stopInsert = insertIgnore(d, r, "id, last_seen, stopped_at", "?, ?, ?", "id")
	s.deleteRelay = "DELETE FROM " + r + " WHERE id = ? AND last_seen = ?"
	// One statement is one snapshot on every dialect: leases and relays are read
	// together.
	s.readCoordination = "SELECT 0, bucket, owner, expires_at, 0, 0, '', 0, '' FROM " + l + " WHERE bucket < ?" +
		" UNION ALL SELECT 1, 0, id, last_seen, stopped_at, bucket_count, " + instanceColumns + " FROM " + r
	// The relay table alone: one row per relay, read between rounds.
	s.readRelays = "SELECT id, last_seen, stopped_at, bucket_count, " + instanceColumns + " FROM " + r

	if d == PostgreSQL {
		for _, p := range []*string{&s.fetch, &s.find, &s.list, &s.reschedule, &s.park, &s.deleteDispatched,
			&s.statsPending, &s.statsHead, &s.statsParked, &s.claimUpdate, &s.claimInsert, &s.renew,
			&s.release, &s.heartbeatUpdate, &s.heartbeatInsert, &s.stopUpdate, &s.stopInsert,
			&s.deleteRelay, &s.readCoordination, &s.readRelays} {
			*p = rebind(*p)
		}
	}
	return s
}

// insertIgnore inserts a row unless its key exists; the affected-row count says
// which happened (1 inserted, 0 present) on every dialect.
func insertIgnore(d Dialect, table, cols, values, key string) string {
	if d == MySQL {
		// Not "ON DUPLICATE KEY UPDATE k = k": a client with the found-rows flag
		// counts that no-op as 1 row, so a refused claim would look granted. IGNORE has
		// no data error to swallow here: relay ids are length-checked first.
		return "INSERT IGNORE INTO " + table + " (" + cols + ") VALUES (" + values + ")"
	}
	return "INSERT INTO " + table + " (" + cols + ") VALUES (" + values + ") ON CONFLICT (" + key + ") DO NOTHING"
}

// rebind turns '?' placeholders into PostgreSQL's $n.
func rebind(q string) string {
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// placeholders writes count groups of width placeholders: "(?, ?), (?, ?)" or the
// $n form, starting after first.
func placeholders(b *strings.Builder, d Dialect, count, width, first int) {
	n := first
	for i := 0; i < count; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for j := 0; j < width; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			n++
			if d == PostgreSQL {
				b.WriteByte('$')
				b.WriteString(strconv.Itoa(n))
			} else {
				b.WriteByte('?')
			}
		}
		b.WriteByte(')')
	}
}

// inList writes "(?, ?, ?)" for count values.
func inList(b *strings.Builder, d Dialect, count, first int) {
	b.WriteByte('(')
	for i := 0; i < count; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		if d == PostgreSQL {
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(first + i + 1))
		} else {
			b.WriteByte('?')
		}
	}
	b.WriteByte(')')
}
