package sqlstore

import (
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Dialect names the SQL database behind a *sql.DB.
type Dialect int

const (
	// PostgreSQL 15 or later, through any database/sql driver (pgx's stdlib is the
	// one tested). LISTEN/NOTIFY wake-ups need pgx's stdlib.
	PostgreSQL Dialect = iota + 1
	// MySQL 8 or MariaDB 10.11 through github.com/go-sql-driver/mysql.
	MySQL
	// SQLite through a pure-Go driver (github.com/glebarez/go-sqlite is the one tested).
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case PostgreSQL:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Defaults applied by [Config]'s validation.
const (
	// DefaultTable is the messages table's default name.
	DefaultTable = "outbox_messages"
	// DefaultMaxMessageSize is the default per-message limit (1 MiB).
	DefaultMaxMessageSize = 1 << 20
	// DefaultStatsLimit is the default cap of the per-bucket counts of Stats.
	DefaultStatsLimit = 10_000
	// DefaultVacuumAfter is the default of Config.VacuumAfter.
	DefaultVacuumAfter = 20_000
)

// Mode is where a PostgreSQL store writes the messages of the fast path.
type Mode int

const (
	// TableMode writes every message as a row of Config.Table, which relays drain. It
	// is the default, and the only mode on MySQL and SQLite.
	TableMode Mode = iota
	// LogMode writes every message into PostgreSQL's write-ahead log with
	// pg_logical_emit_message, in the sender's transaction, and writes no row: a relay
	// reads the messages from a logical replication slot (Config.Slot) in commit order.
	// Messages the broker keeps refusing go to the table, which relays drain as in
	// TableMode. It needs PostgreSQL 14 or later with wal_level=logical, and the slot
	// and publication that [Store.Migrate] creates; see docs/stores/postgres-log.md.
	LogMode
)

func (m Mode) String() string {
	switch m {
	case TableMode:
		return "table"
	case LogMode:
		return "log"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Config configures a [Store]. The zero value is valid: every field has a default.
type Config struct {
	// Table is the messages table, optionally schema-qualified ("billing.outbox").
	// Each part must be a plain SQL identifier: a letter or underscore, then letters,
	// digits or underscores, at most 63 characters. Defaults to "outbox_messages".
	Table string
	// LeaseTable holds one lease per bucket. Defaults to Table + "_leases".
	LeaseTable string
	// RelayTable holds one heartbeat record per relay. Defaults to Table + "_relays".
	RelayTable string
	// BucketCount must equal the bucket count of every writer and relay sharing the
	// tables. Defaults to driver.DefaultBucketCount.
	BucketCount int
	// MaxMessageSize is the largest [outbox.Message.Size] Enqueue and the units of
	// work accept. Defaults to DefaultMaxMessageSize (1 MiB). MySQL also needs a
	// max_allowed_packet that fits a whole batch.
	MaxMessageSize int
	// StatsLimit caps each per-bucket count of Stats, so sampling a large backlog
	// stays cheap. Defaults to DefaultStatsLimit.
	StatsLimit int
	// NotifyChannel is the PostgreSQL LISTEN/NOTIFY channel, an identifier like the
	// table names. Defaults to the messages table's name (dots become underscores).
	// Ignored on MySQL and SQLite.
	NotifyChannel string
	// DisableNotify turns PostgreSQL NOTIFY off: writes send no notification and
	// Subscribe does not LISTEN, so only in-process commits wake a dispatcher.
	// Defaults to false.
	DisableNotify bool
	// VacuumAfter is, on PostgreSQL, how many messages the store deletes (as relays
	// complete them) between two VACUUMs of the message table that it runs in the
	// background, so a busy queue reuses its space within seconds instead of growing
	// until autovacuum's next visit. The VACUUM skips a table another VACUUM holds and
	// never truncates it; after one that took d, the next waits at least 9·d. It needs the table's owner (or the MAINTAIN privilege);
	// without it PostgreSQL skips the table with a warning. Defaults to
	// DefaultVacuumAfter (20,000); -1 turns it off. Ignored on MySQL and SQLite, whose
	// engines reclaim deleted rows by themselves.
	VacuumAfter int
	// Logger receives listener reconnects and other background events. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Mode is TableMode (the default) or, on PostgreSQL only, LogMode.
	Mode Mode
	// Slot is LogMode's logical replication slot: lower-case letters, digits and
	// underscores, at most 63. Defaults to the messages table's name in lower case
	// (dots become underscores) + "_slot". Ignored in TableMode.
	Slot string
	// Publication is LogMode's publication, which publishes no table: the slot's
	// reader asks for the logical decoding messages alone. A plain identifier.
	// Defaults to the messages table's name (dots become underscores) + "_pub".
	// Ignored in TableMode.
	Publication string
	// ReplicationURL is the connection string of LogMode's replication connection
	// (the user needs the REPLICATION attribute). Defaults to the pgx pool's
	// connection settings (NewPgx), or those of a pgx stdlib connection of the
	// *sql.DB (NewDB, NewORM); another database/sql driver needs it set. Ignored in
	// TableMode.
	ReplicationURL string
}

var slotName = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// validName checks a possibly schema-qualified name.
func validName(field, name string) error {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return fmt.Errorf("%w: sqlstore: Config.%s %q: at most one schema qualifier is allowed", outbox.ErrMisconfigured, field, name)
	}
	for _, p := range parts {
		if !identifier.MatchString(p) {
			return fmt.Errorf("%w: sqlstore: Config.%s %q is not a plain SQL identifier (a letter or underscore, then letters, digits or underscores, at most 63)", outbox.ErrMisconfigured, field, name)
		}
	}
	return nil
}

// withDefaults returns a validated copy with every default filled in.
func (c Config) withDefaults() (Config, error) {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if err := validName("Table", c.Table); err != nil {
		return c, err
	}
	if c.LeaseTable == "" {
		c.LeaseTable = c.Table + "_leases"
	}
	if err := validName("LeaseTable", c.LeaseTable); err != nil {
		return c, err
	}
	if c.RelayTable == "" {
		c.RelayTable = c.Table + "_relays"
	}
	if err := validName("RelayTable", c.RelayTable); err != nil {
		return c, err
	}
	if err := validName("Table", c.Table+"_migrations"); err != nil {
		return c, fmt.Errorf("%w (Migrate keeps its versions in Table+\"_migrations\"; shorten Table)", err)
	}
	if c.LeaseTable == c.Table || c.RelayTable == c.Table || c.LeaseTable == c.RelayTable {
		return c, fmt.Errorf("%w: sqlstore: Config.Table, LeaseTable and RelayTable must differ", outbox.ErrMisconfigured)
	}
	switch {
	case c.BucketCount == 0:
		c.BucketCount = driver.DefaultBucketCount
	case c.BucketCount < 0:
		return c, fmt.Errorf("%w: sqlstore: Config.BucketCount %d must be positive", outbox.ErrMisconfigured, c.BucketCount)
	}
	switch {
	case c.MaxMessageSize == 0:
		c.MaxMessageSize = DefaultMaxMessageSize
	case c.MaxMessageSize < 0:
		return c, fmt.Errorf("%w: sqlstore: Config.MaxMessageSize %d must be positive", outbox.ErrMisconfigured, c.MaxMessageSize)
	}
	switch {
	case c.StatsLimit == 0:
		c.StatsLimit = DefaultStatsLimit
	case c.StatsLimit < 0:
		return c, fmt.Errorf("%w: sqlstore: Config.StatsLimit %d must be positive", outbox.ErrMisconfigured, c.StatsLimit)
	}
	switch {
	case c.VacuumAfter == 0:
		c.VacuumAfter = DefaultVacuumAfter
	case c.VacuumAfter < -1:
		return c, fmt.Errorf("%w: sqlstore: Config.VacuumAfter %d must be positive, or -1 for off", outbox.ErrMisconfigured, c.VacuumAfter)
	}
	if c.NotifyChannel == "" {
		c.NotifyChannel = strings.ReplaceAll(c.Table, ".", "_")
	}
	if !identifier.MatchString(c.NotifyChannel) {
		return c, fmt.Errorf("%w: sqlstore: Config.NotifyChannel %q is not a plain SQL identifier", outbox.ErrMisconfigured, c.NotifyChannel)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch c.Mode {
	case TableMode:
	case LogMode:
		base := strings.ReplaceAll(c.Table, ".", "_")
		if c.Slot == "" {
			c.Slot = strings.ToLower(base) + "_slot"
		}
		if !slotName.MatchString(c.Slot) {
			return c, fmt.Errorf("%w: sqlstore: Config.Slot %q is not a replication slot name (lower-case letters, digits and underscores, at most 63)", outbox.ErrMisconfigured, c.Slot)
		}
		if c.Publication == "" {
			c.Publication = base + "_pub"
		}
		if !identifier.MatchString(c.Publication) {
			return c, fmt.Errorf("%w: sqlstore: Config.Publication %q is not a plain SQL identifier", outbox.ErrMisconfigured, c.Publication)
		}
	default:
		return c, fmt.Errorf("%w: sqlstore: Config.Mode %v: use TableMode or LogMode", outbox.ErrMisconfigured, c.Mode)
	}
	return c, nil
}
