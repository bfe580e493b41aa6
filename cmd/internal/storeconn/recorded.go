package storeconn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/driver"
)

// Recorded is a bucket count a store records, and where it was read.
type Recorded struct {
	// Count is the recorded bucket count; 0 when the store records none.
	Count int
	// Source says where the count was read, for messages: "table
	// outbox_messages_settings", "message 0192…", "relay relay-1's heartbeat".
	Source string
}

// RecordedBucketCount reads the bucket count the store records, whatever count it
// was opened with. A SQL store records it in its settings table (Table+"_settings",
// row bucket_count), where its migration or its first relay put it. A DynamoDB store
// stamps it on every message and every relay heartbeat: the first pending or parked
// message found in the store's buckets says it, else the latest heartbeat that
// carries one. A store that records none (tables not migrated yet, an empty
// DynamoDB table no relay has run on) gives a zero Recorded and no error.
func (s *Store) RecordedBucketCount(ctx context.Context) (Recorded, error) {
	switch {
	case s.SQL != nil:
		table := s.SQL.Config().Table + "_settings"
		rows, err := s.query(ctx, "SELECT value FROM "+table+" WHERE name = 'bucket_count'")
		switch {
		case err != nil && s.missing(err):
			return Recorded{}, nil
		case err != nil:
			return Recorded{}, fmt.Errorf("%s: read the recorded bucket count from %s: %w", s.Kind, table, err)
		case len(rows) == 0 || rows[0][0] <= 0:
			return Recorded{}, nil
		}
		return Recorded{Count: int(rows[0][0]), Source: "table " + table}, nil
	case s.Dynamo != nil:
		adm, ok := s.Store.(driver.Admin)
		if !ok {
			return Recorded{}, nil
		}
		for _, status := range []driver.Status{driver.Pending, driver.Parked} {
			envs, err := adm.List(ctx, status, driver.Cursor{}, 1)
			if err != nil {
				return Recorded{}, fmt.Errorf("dynamodb: read a message's bucket count: %w", err)
			}
			if len(envs) > 0 && envs[0].BucketCount > 0 {
				return Recorded{Count: envs[0].BucketCount, Source: fmt.Sprintf("%s message %s", status, envs[0].ID)}, nil
			}
		}
		view, err := s.ReadCoordination(ctx)
		if err != nil {
			return Recorded{}, fmt.Errorf("dynamodb: read the relays' bucket count: %w", err)
		}
		var latest driver.RelayRecord
		for _, r := range view.Relays {
			if r.BucketCount > 0 && r.LastSeen.After(latest.LastSeen) {
				latest = r
			}
		}
		if latest.BucketCount > 0 {
			return Recorded{Count: latest.BucketCount, Source: fmt.Sprintf("relay %s's heartbeat of %s", latest.ID, latest.LastSeen.UTC().Format(time.RFC3339))}, nil
		}
	}
	return Recorded{}, nil
}

// Migration is one schema version a SQL store's migration applied.
type Migration struct {
	Version   int
	AppliedAt time.Time
}

// Migrations lists the schema versions applied to a SQL store's tables, oldest first,
// from the table its migration keeps them in (Table+"_migrations"); none when that
// table does not exist (the store was never migrated). Other stores have none.
func (s *Store) Migrations(ctx context.Context) ([]Migration, error) {
	if s.SQL == nil {
		return nil, nil
	}
	table := s.SQL.Config().Table + "_migrations"
	rows, err := s.query(ctx, "SELECT version, applied_at FROM "+table+" ORDER BY version")
	switch {
	case err != nil && s.missing(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%s: read the applied migrations from %s: %w", s.Kind, table, err)
	}
	out := make([]Migration, 0, len(rows))
	for _, r := range rows {
		out = append(out, Migration{Version: int(r[0]), AppliedAt: time.UnixMicro(r[1]).UTC()})
	}
	return out, nil
}

// StreamLease reads the lease of the stream's reader ([driver.StreamLease]) of a store
// that has a stream (a PostgreSQL store opened in log mode): the relay that reads the
// replication slot, and until when its lease runs. The store's ReadCoordination leaves
// this lease out (relays plan buckets with it); this reads it from the lease table.
// found is false for a store without a stream, and when no relay ever took it; a
// lease handed back has no owner.
func (s *Store) StreamLease(ctx context.Context) (lease driver.Lease, found bool, err error) {
	if _, ok := s.Store.(driver.Streamer); !ok || s.pool == nil {
		return driver.Lease{}, false, nil
	}
	table := s.SQL.Config().LeaseTable
	var expires int64
	lease.Bucket = driver.StreamLease
	err = s.pool.QueryRow(ctx, "SELECT owner, expires_at FROM "+table+" WHERE bucket = $1", driver.StreamLease).Scan(&lease.Owner, &expires)
	switch {
	case errors.Is(err, pgx.ErrNoRows) || (err != nil && s.missing(err)):
		return driver.Lease{}, false, nil
	case err != nil:
		return driver.Lease{}, false, fmt.Errorf("%s: read the stream lease from %s: %w", s.Kind, table, err)
	}
	if expires != 0 {
		lease.ExpiresAt = time.UnixMicro(expires).UTC()
	}
	return lease, true, nil
}

// pgxQuery runs a SELECT of integer columns through a pgx pool.
func pgxQuery(pool *pgxpool.Pool) func(context.Context, string) ([][]int64, error) {
	return func(ctx context.Context, stmt string) ([][]int64, error) {
		rows, err := pool.Query(ctx, stmt)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var out [][]int64
		for rows.Next() {
			row := make([]int64, len(rows.FieldDescriptions()))
			dest := make([]any, len(row))
			for i := range row {
				dest[i] = &row[i]
			}
			if err := rows.Scan(dest...); err != nil {
				return nil, err
			}
			out = append(out, row)
		}
		return out, rows.Err()
	}
}

// sqlQuery runs a SELECT of integer columns through database/sql.
func sqlQuery(db *sql.DB) func(context.Context, string) ([][]int64, error) {
	return func(ctx context.Context, stmt string) ([][]int64, error) {
		rows, err := db.QueryContext(ctx, stmt)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			return nil, err
		}
		var out [][]int64
		for rows.Next() {
			row := make([]int64, len(cols))
			dest := make([]any, len(row))
			for i := range row {
				dest[i] = &row[i]
			}
			if err := rows.Scan(dest...); err != nil {
				return nil, err
			}
			out = append(out, row)
		}
		return out, rows.Err()
	}
}

// pgMissingTable reports PostgreSQL's undefined_table and invalid_schema_name.
func pgMissingTable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "42P01" || pe.Code == "3F000")
}

// mysqlMissingTable reports MySQL's ER_NO_SUCH_TABLE.
func mysqlMissingTable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}

// sqliteMissingTable reports SQLite's "no such table" (its drivers give no code).
func sqliteMissingTable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "no such table")
}
