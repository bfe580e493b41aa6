package sqlstore

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/outboxkit/outbox"
)

//go:embed migrations
var migrationFiles embed.FS

// migration is one numbered, rendered schema step.
type migration struct {
	version    int
	statements []string
}

// tableNames feeds the migration templates. Every name was validated as an
// identifier, so splicing them is safe.
type tableNames struct {
	Table, LeaseTable, RelayTable string
}

// Index names an index after the messages table (without its schema: an index lives
// in its table's schema).
func (n tableNames) Index(suffix string) string {
	base := n.Table
	if i := strings.LastIndexByte(base, '.'); i >= 0 {
		base = base[i+1:]
	}
	return base + "_" + suffix
}

func loadMigrations(d Dialect, c Config) ([]migration, error) {
	dir := path.Join("migrations", d.String())
	entries, err := fs.ReadDir(migrationFiles, dir)
	if err != nil {
		return nil, err
	}
	names := tableNames{Table: c.Table, LeaseTable: c.LeaseTable, RelayTable: c.RelayTable}
	var out []migration
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		if !ok || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		version, err := strconv.Atoi(prefix)
		if err != nil {
			return nil, fmt.Errorf("sqlstore: migration %s: bad version: %w", e.Name(), err)
		}
		raw, err := fs.ReadFile(migrationFiles, path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		tmpl, err := template.New(e.Name()).Parse(string(raw))
		if err != nil {
			return nil, err
		}
		var buf bytes.Buffer
		if err := tmpl.Execute(&buf, names); err != nil {
			return nil, err
		}
		out = append(out, migration{version: version, statements: splitStatements(buf.String())})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	return out, nil
}

// splitStatements cuts a script at semicolons that end a line: drivers differ on
// multi-statement support (MySQL needs a DSN flag), so each runs alone.
func splitStatements(script string) []string {
	var out []string
	for _, part := range strings.Split(script, ";\n") {
		if s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(part), ";")); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// addColumn matches a step that adds a column. MySQL 8 and SQLite have no ADD COLUMN
// IF NOT EXISTS, so such a step is not idempotent by itself.
var addColumn = regexp.MustCompile(`(?i)^ALTER\s+TABLE\s+(\S+)\s+ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)\s`)

// columnAdded reports whether a failed step was an ADD COLUMN whose column exists: a
// concurrent Migrate (or a team's own tooling) added it first, so the step is done.
// It probes the column rather than matching each driver's duplicate-column error.
func columnAdded(ctx context.Context, q querier, stmt string) bool {
	m := addColumn.FindStringSubmatch(stmt)
	if m == nil {
		return false
	}
	rs, err := q.query(ctx, "SELECT "+m[2]+" FROM "+m[1]+" WHERE 1 = 0")
	if err != nil {
		return false
	}
	for rs.Next() {
	}
	rs.Close()
	return rs.Err() == nil
}

// DDL returns the schema statements Migrate runs for the store's dialect and tables,
// for teams that apply migrations with their own tooling. Statements are in order,
// without trailing semicolons: version 1 creates the tables (IF NOT EXISTS), version
// 2 is an ALTER TABLE that adds the relay table's bucket_count column, version 3
// creates the inbox table, Table+"_inbox" (IF NOT EXISTS; see [Store.InboxTable]),
// version 4 creates the settings table, Table+"_settings", version 5 is three ALTER
// TABLE statements that add the relay table's instance columns, and the last statement
// records the store's bucket count in it (unless one is recorded: a relay's Start
// records it too, and every store built with another count then fails).
// On MySQL and SQLite the ALTERs of versions 2 and 5 fail if the column exists
// already; apply them once.
func (s *Store) DDL() []string {
	ms, err := loadMigrations(s.dialect, s.cfg)
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.statements...)
	}
	record := insertIgnore(s.dialect, s.settingsTable(), "name, value", fmt.Sprintf("'%s', %d", bucketCountSetting, s.cfg.BucketCount), "name")
	return append(out, record)
}

// MigrationVersions lists the schema versions [Store.Migrate] applies, oldest first:
// a tool compares them with the versions recorded in Table+"_migrations" to tell
// whether the tables are behind.
func (s *Store) MigrationVersions() []int {
	ms, err := loadMigrations(s.dialect, s.cfg)
	if err != nil {
		return nil
	}
	out := make([]int, len(ms))
	for i, m := range ms {
		out[i] = m.version
	}
	return out
}

// Migrate creates or upgrades the store's tables from the embedded migrations, and
// records the store's bucket count in them; tables migrated for another count fail it
// with [outbox.ErrMisconfigured] (so do writes and a relay's Start). It is
// safe to run at every start and from several processes at once: each step is
// idempotent (IF NOT EXISTS, or an added column that exists already is taken as
// added) and recorded in Table+"_migrations", and on PostgreSQL the whole
// migration runs in one transaction under an advisory lock (concurrent CREATE TABLE
// IF NOT EXISTS can otherwise collide there).
func (s *Store) Migrate(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	ms, err := loadMigrations(s.dialect, s.cfg)
	if err != nil {
		return fmt.Errorf("sqlstore: migrate: %w", err)
	}
	if s.dialect != PostgreSQL {
		// MySQL commits DDL implicitly; SQLite serialises writers anyway.
		return s.migrate(ctx, s.db, ms)
	}
	if s.logMode() {
		// Refuse before anything is created.
		if err := s.checkLog(ctx, s.db, false); err != nil {
			return err
		}
	}
	h := fnv.New64a()
	h.Write([]byte("outbox migrate " + s.cfg.Table))
	key := int64(h.Sum64())
	err = s.inTx(ctx, func(q querier) error {
		if _, err := q.exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
			return s.wrap(ctx, "migrate", err)
		}
		return s.migrate(ctx, q, ms)
	})
	if err != nil || !s.logMode() {
		return err
	}
	return s.migrateLog(ctx)
}

func (s *Store) migrate(ctx context.Context, q querier, ms []migration) error {
	versions := s.cfg.Table + "_migrations"
	create := "CREATE TABLE IF NOT EXISTS " + versions + " (version INTEGER NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)"
	if _, err := q.exec(ctx, create); err != nil {
		return s.wrap(ctx, "migrate", err)
	}
	applied := map[int]bool{}
	rs, err := q.query(ctx, "SELECT version FROM "+versions)
	if err != nil {
		return s.wrap(ctx, "migrate", err)
	}
	for rs.Next() {
		var v int64
		if err := rs.Scan(&v); err != nil {
			rs.Close()
			return s.wrap(ctx, "migrate", err)
		}
		applied[int(v)] = true
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return s.wrap(ctx, "migrate", err)
	}
	record := insertIgnore(s.dialect, versions, "version, applied_at", "?, ?", "version")
	if s.dialect == PostgreSQL {
		record = rebind(record)
	}
	for _, m := range ms {
		if applied[m.version] {
			continue
		}
		for _, stmt := range m.statements {
			if _, err := q.exec(ctx, stmt); err != nil && !columnAdded(ctx, q, stmt) {
				return s.wrap(ctx, fmt.Sprintf("migrate to version %d", m.version), err)
			}
		}
		if _, err := q.exec(ctx, record, m.version, time.Now().UnixMicro()); err != nil {
			return s.wrap(ctx, "migrate", err)
		}
	}
	return s.recordBucketCount(ctx, q)
}

// DropTables drops the store's tables and every message in them, and in LogMode its
// slot and publication ([Store.DropLog]). Tests and demos use it; production schemas
// are rarely dropped by code.
func (s *Store) DropTables(ctx context.Context) error {
	if s.logMode() {
		if err := s.dropLog(ctx); err != nil {
			return err
		}
	}
	for _, t := range []string{s.cfg.Table, s.cfg.LeaseTable, s.cfg.RelayTable, s.InboxTable(), s.settingsTable(), s.cfg.Table + "_migrations"} {
		if _, err := s.db.exec(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			return s.wrap(ctx, "drop tables", err)
		}
	}
	return nil
}

// Check implements [driver.Store]: one SELECT per table that reads no row, naming
// every column the relay uses. A table or column that does not exist is an error
// wrapping [outbox.ErrMisconfigured] that says to run [Store.Migrate]; other errors
// come back wrapped, context errors as they are.
//
// In LogMode it first checks the server (PostgreSQL 14 or later, wal_level=logical)
// and that the slot and the publication exist.
func (s driverStore) Check(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if s.logMode() {
		if err := s.checkLog(ctx, s.db, true); err != nil {
			return err
		}
	}
	for _, t := range []struct{ name, columns string }{
		{s.cfg.Table, selectColumns},
		{s.cfg.LeaseTable, "bucket, owner, expires_at"},
		{s.cfg.RelayTable, "id, last_seen, stopped_at, bucket_count, " + instanceColumns},
		{s.settingsTable(), "name, value"},
	} {
		err := s.probe(ctx, "SELECT "+t.columns+" FROM "+t.name+" WHERE 1 = 0")
		if err == nil {
			continue
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		if missingSchema(err) {
			what := "does not exist"
			if !missingTable(err) {
				what = "lacks a column this version uses"
			}
			return fmt.Errorf("%w: sqlstore: table %q %s: run Store.Migrate (or apply Store.DDL) before starting a relay: %w",
				outbox.ErrMisconfigured, t.name, what, err)
		}
		return s.wrap(ctx, "check", err)
	}
	// Compare with the recorded count (a read); record it only if the tables were set
	// up from DDL without it, so a relay's start takes no write lock in the usual case.
	if err := s.compareBucketCount(ctx, s.db); !errors.Is(err, errNoBucketCount) {
		return err
	}
	return s.recordBucketCount(ctx, s.db)
}

// probe runs query and reads its (empty) result.
func (s *Store) probe(ctx context.Context, query string) error {
	rs, err := s.db.query(ctx, query)
	if err != nil {
		return err
	}
	for rs.Next() {
	}
	rs.Close()
	return rs.Err()
}

// missingTable reports the missingSchema errors that name a table rather than a
// column: SQLSTATE 42P01, MySQL's 1146, SQLite's "no such table".
func missingTable(err error) bool {
	var state interface{ SQLState() string }
	if errors.As(err, &state) {
		return state.SQLState() == "42P01"
	}
	msg := err.Error()
	return strings.Contains(msg, "Error 1146") || strings.Contains(msg, "no such table")
}
