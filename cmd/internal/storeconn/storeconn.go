// Package storeconn opens the store a DSN names, for the project's programs
// (outboxctl and outbox-relay): both connect to a store the same way, and both
// refuse settings they cannot use the same way, with an error wrapping [ErrUsage]
// that names the flag the operator typed (-store, -table, -buckets, -aws-endpoint,
// -log-mode, -slot, -publication, -replication-url). [AddLogModeFlags] defines the
// log-mode flags, the same in every program.
//
// An open store also reads what its tables record: the bucket count they were
// migrated for ([Store.RecordedBucketCount]) and, for SQL stores, the schema versions
// applied ([Store.Migrations]), so that a tool can take the store's count instead of
// a guess and say which migrations ran.
package storeconn

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/glebarez/go-sqlite" // the pure-Go "sqlite" driver
	"github.com/go-sql-driver/mysql"  // also registers the "mysql" driver
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// Options say which store to open. Each field is one flag of the programs that take
// it, and the errors about a field name its flag: -store, -table, -buckets,
// -aws-region, -aws-endpoint, -log-mode, -slot, -publication and -replication-url.
type Options struct {
	// DSN names the store: postgres://… or postgresql://… (pgx), mysql://DSN (a
	// go-sql-driver DSN after the scheme), sqlite:PATH or file:PATH (a SQLite file),
	// dynamodb://TABLE.
	DSN string
	// Table is the SQL messages table ("" = the store's default). DynamoDB stores
	// refuse it: their table is named in DSN.
	Table string
	// Buckets is the bucket count (0 = the store's default).
	Buckets int
	// Region and Endpoint reach DynamoDB (and SQS); empty = the SDK's defaults.
	Region, Endpoint string
	// LogMode opens a PostgreSQL store in the SQL store's log mode
	// (sqlstore.LogMode: messages in the write-ahead log, read through a logical
	// replication slot). Other stores refuse it.
	LogMode bool
	// Slot, Publication and ReplicationURL are the log mode's settings (sqlstore.Config's
	// fields of those names); "" = the store's defaults: TABLE_slot, TABLE_pub, and
	// the -store connection's settings. Each needs LogMode.
	Slot, Publication, ReplicationURL string
}

// AddLogModeFlags defines -log-mode, -slot, -publication and -replication-url on fs,
// into o, with the store's defaults.
func AddLogModeFlags(fs *flag.FlagSet, o *Options) {
	fs.BoolVar(&o.LogMode, "log-mode", false, "PostgreSQL: the store's log mode: messages in the write-ahead log, read through a logical replication slot (the server needs wal_level=logical); default false, the table mode")
	fs.StringVar(&o.Slot, "slot", "", "with -log-mode: the logical replication slot; default the messages table's name + _slot (outbox_messages_slot)")
	fs.StringVar(&o.Publication, "publication", "", "with -log-mode: the publication; default the messages table's name + _pub (outbox_messages_pub)")
	fs.StringVar(&o.ReplicationURL, "replication-url", "", "with -log-mode: the connection of the replication stream, postgres://… (a user with REPLICATION, not through a pooler in transaction mode); default the -store connection's settings")
}

// Store is a store's relay side and what it was built on. It is a [driver.Handle],
// so a relay can be built on it.
type Store struct {
	// Store is the relay side of the store's handle (its Driver method's result):
	// relays and the operator commands work through it and the optional
	// capabilities it implements.
	driver.Store
	Kind      string // "postgres", "mysql", "sqlite", "dynamodb"
	SQL       *sqlstore.Store
	Dynamo    *dynamostore.Store
	DDB       *dynamodb.Client
	DDBConfig dynamostore.Config
	closeAll  func() error
	// query runs a SELECT of integer columns on a SQL store's database; missing
	// reports whether its error says that a table does not exist.
	query   func(ctx context.Context, stmt string) ([][]int64, error)
	missing func(error) bool
	// pool is a PostgreSQL store's pool; nil otherwise.
	pool *pgxpool.Pool
}

var _ driver.Handle = (*Store)(nil)

// Driver returns the store's relay side.
func (s *Store) Driver() driver.Store { return s.Store }

// Close closes the store and the client it was opened on.
func (s *Store) Close() error { return s.closeAll() }

// ErrUsage marks an error in what the user asked for: a flag that is missing, cannot
// be parsed or names something that cannot be. The message names the flag.
var ErrUsage = errors.New("usage")

// sqlName is one part of a SQL table name, as the SQL store accepts it.
var sqlName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// longestSuffix is the longest suffix the SQL store appends to the messages table's
// name for its other tables ("_migrations"); a name part is at most 63 characters.
const longestSuffix = len("_migrations")

// checkTable validates -table as the SQL store would, in the flag's terms.
func checkTable(table string) error {
	if table == "" {
		return nil
	}
	parts := strings.Split(table, ".")
	bad := func(why string) error {
		return fmt.Errorf("%w: -table %q: %s", ErrUsage, table, why)
	}
	if len(parts) > 2 {
		return bad("at most one schema qualifier (SCHEMA.TABLE)")
	}
	for _, p := range parts {
		if !sqlName.MatchString(p) {
			return bad("each part must be a letter or underscore, then letters, digits or underscores")
		}
		if len(p) > 63 {
			return bad(fmt.Sprintf("a part is at most 63 characters; %q has %d", p, len(p)))
		}
	}
	if n := len(parts[len(parts)-1]); n > 63-longestSuffix {
		return bad(fmt.Sprintf("the table is at most %d characters (the store names its other tables after it, up to TABLE_migrations); it has %d", 63-longestSuffix, n))
	}
	return nil
}

// checkOptions validates what does not need the store's kind.
func checkOptions(opts Options) error {
	if opts.Buckets < 0 {
		return fmt.Errorf("%w: -buckets %d: a bucket count is 1 or more (leave it unset for the store's)", ErrUsage, opts.Buckets)
	}
	if opts.Endpoint != "" {
		u, err := url.Parse(opts.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: -aws-endpoint %q: give a URL, http://HOST:PORT or https://HOST", ErrUsage, opts.Endpoint)
		}
	}
	return nil
}

// Names the log mode accepts, as the SQL store validates them.
var (
	slotName        = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)
	publicationName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
)

// IsPostgres reports whether dsn names a PostgreSQL store (postgres:// or
// postgresql://), the one store with a log mode.
func IsPostgres(dsn string) bool {
	scheme, _, _ := strings.Cut(dsn, ":")
	scheme = strings.ToLower(scheme)
	return scheme == "postgres" || scheme == "postgresql"
}

// checkLogMode validates the log mode's flags in their terms: only for PostgreSQL,
// -slot, -publication and -replication-url only with -log-mode.
func checkLogMode(opts Options) error {
	given := []struct {
		flag string
		set  bool
	}{{"-log-mode", opts.LogMode}, {"-slot", opts.Slot != ""}, {"-publication", opts.Publication != ""}, {"-replication-url", opts.ReplicationURL != ""}}
	for _, g := range given {
		switch {
		case !g.set:
		case !IsPostgres(opts.DSN):
			return fmt.Errorf("%w: %s is for PostgreSQL stores (-store postgres://…), the only ones with a log mode", ErrUsage, g.flag)
		case !opts.LogMode:
			return fmt.Errorf("%w: %s is a setting of the log mode: add -log-mode, or drop %s", ErrUsage, g.flag, g.flag)
		}
	}
	if opts.Slot != "" && !slotName.MatchString(opts.Slot) {
		return fmt.Errorf("%w: -slot %q: a replication slot's name is lower-case letters, digits and underscores, at most 63", ErrUsage, opts.Slot)
	}
	if opts.Publication != "" && !publicationName.MatchString(opts.Publication) {
		return fmt.Errorf("%w: -publication %q: a publication's name is a letter or underscore, then letters, digits or underscores, at most 63", ErrUsage, opts.Publication)
	}
	if opts.ReplicationURL != "" {
		if _, err := pgconn.ParseConfig(opts.ReplicationURL); err != nil {
			return fmt.Errorf("%w: -replication-url: not a PostgreSQL URL (postgres://USER:PASSWORD@HOST:5432/DB?sslmode=…): %v", ErrUsage, err)
		}
	}
	return nil
}

// misconfigured turns an error a store's constructor returned about the settings this
// package passed it into a usage error naming the flags they came from.
func misconfigured(err error, flags string) error {
	if errors.Is(err, outbox.ErrMisconfigured) {
		return fmt.Errorf("%w: %s: %w", ErrUsage, flags, err)
	}
	return err
}

// Open connects to the store opts names. It checks the connection. Settings it cannot
// use fail it with an error wrapping [ErrUsage] that names the flag; a store it
// cannot reach fails it with another error.
func Open(ctx context.Context, opts Options) (*Store, error) {
	dsn := opts.DSN
	if dsn == "" {
		return nil, fmt.Errorf("%w: no store: pass -store (or set OUTBOX_STORE) to postgres://…, mysql://…, sqlite:PATH or dynamodb://TABLE", ErrUsage)
	}
	if err := checkOptions(opts); err != nil {
		return nil, err
	}
	if err := checkLogMode(opts); err != nil {
		return nil, err
	}
	sqlCfg := sqlstore.Config{Table: opts.Table, BucketCount: opts.Buckets}
	if opts.LogMode {
		sqlCfg.Mode = sqlstore.LogMode
		sqlCfg.Slot, sqlCfg.Publication, sqlCfg.ReplicationURL = opts.Slot, opts.Publication, opts.ReplicationURL
	}
	scheme, rest, _ := strings.Cut(dsn, ":")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql", "mysql", "mariadb", "sqlite", "file":
		if err := checkTable(opts.Table); err != nil {
			return nil, err
		}
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, fmt.Errorf("%w: -store: not a PostgreSQL URL (postgres://USER:PASSWORD@HOST:5432/DB?sslmode=…): %v", ErrUsage, err)
		}
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("postgres: %w", err)
		}
		if err := pool.Ping(ctx); err != nil {
			pool.Close()
			return nil, fmt.Errorf("postgres: connect: %w", err)
		}
		st, err := sqlstore.NewPgx(pool, sqlCfg)
		if err != nil {
			pool.Close()
			flags := "-table or -buckets"
			if opts.LogMode {
				flags = "-table, -buckets, -slot or -publication"
			}
			return nil, misconfigured(err, flags)
		}
		return &Store{Store: st.Driver(), Kind: "postgres", SQL: st, closeAll: func() error {
			err := st.Close()
			pool.Close()
			return err
		}, query: pgxQuery(pool), missing: pgMissingTable, pool: pool}, nil
	case "mysql", "mariadb":
		mdsn := strings.TrimPrefix(rest, "//")
		if _, err := mysql.ParseDSN(mdsn); err != nil {
			return nil, fmt.Errorf("%w: -store: after mysql:// comes a go-sql-driver DSN (USER:PASSWORD@tcp(HOST:3306)/DB?parseTime=true): %v", ErrUsage, err)
		}
		return openSQL(ctx, "mysql", sqlstore.MySQL, mdsn, sqlCfg)
	case "sqlite", "file":
		path := rest
		if scheme == "file" {
			path = dsn
		}
		if path == "" {
			return nil, fmt.Errorf("%w: sqlite: no file: pass sqlite:PATH", ErrUsage)
		}
		if !strings.Contains(path, "?") {
			// One writer at a time: immediate transactions and a busy timeout make
			// writers wait instead of failing with SQLITE_BUSY.
			path += "?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
		}
		return openSQL(ctx, "sqlite", sqlstore.SQLite, path, sqlCfg)
	case "dynamodb":
		u, err := url.Parse(dsn)
		if err != nil || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("%w: -store %q: name the table: dynamodb://TABLE", ErrUsage, dsn)
		}
		if opts.Table != "" {
			return nil, fmt.Errorf("%w: -table is for SQL stores; a DynamoDB store's table is named in -store dynamodb://TABLE", ErrUsage)
		}
		if n := len(u.Host); n < 3 || n > 255 || strings.Trim(u.Host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") != "" {
			return nil, fmt.Errorf("%w: -store %q: a DynamoDB table name is 3 to 255 letters, digits, '_', '-' and '.'", ErrUsage, dsn)
		}
		cfg := dynamostore.Config{TableName: u.Host, BucketCount: opts.Buckets}
		if err := cfg.Validate(); err != nil {
			return nil, misconfigured(err, fmt.Sprintf("-store %q", dsn))
		}
		client, err := DynamoClient(ctx, opts.Region, opts.Endpoint)
		if err != nil {
			return nil, err
		}
		st, err := dynamostore.New(client, cfg)
		if err != nil {
			return nil, misconfigured(err, "-store or -buckets")
		}
		return &Store{Store: st.Driver(), Kind: "dynamodb", Dynamo: st, DDB: client, DDBConfig: cfg, closeAll: st.Close}, nil
	}
	return nil, fmt.Errorf("%w: store %q: the scheme must be postgres://, mysql://, sqlite:, file: or dynamodb://", ErrUsage, Redact(dsn))
}

func openSQL(ctx context.Context, driver string, dialect sqlstore.Dialect, dsn string, cfg sqlstore.Config) (*Store, error) {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", driver, err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("%s: connect: %w", driver, err)
	}
	if dialect == sqlstore.SQLite {
		db.SetMaxOpenConns(1) // one writer; also keeps a shared in-memory database alive
	} else {
		db.SetMaxIdleConns(8)
	}
	st, err := sqlstore.NewDB(db, dialect, cfg)
	if err != nil {
		_ = db.Close()
		return nil, misconfigured(err, "-table or -buckets")
	}
	kind, missing := "mysql", mysqlMissingTable
	if dialect == sqlstore.SQLite {
		kind, missing = "sqlite", sqliteMissingTable
	}
	return &Store{Store: st.Driver(), Kind: kind, SQL: st, closeAll: func() error {
		return errors.Join(st.Close(), db.Close())
	}, query: sqlQuery(db), missing: missing}, nil
}

// AWSConfig loads the SDK's configuration (environment, shared files, instance
// roles) with an optional region and endpoint.
func AWSConfig(ctx context.Context, region string) (aws.Config, error) {
	var opts []func(*awsconfig.LoadOptions) error
	if region != "" {
		opts = append(opts, awsconfig.WithRegion(region))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return cfg, fmt.Errorf("aws: load configuration: %w", err)
	}
	if cfg.Region == "" {
		return cfg, fmt.Errorf("%w: aws: no region: pass -aws-region or set AWS_REGION", ErrUsage)
	}
	return cfg, nil
}

// DynamoClient builds a DynamoDB client for region (default the SDK's) and, when set,
// an endpoint URL instead of AWS's.
func DynamoClient(ctx context.Context, region, endpoint string) (*dynamodb.Client, error) {
	cfg, err := AWSConfig(ctx, region)
	if err != nil {
		return nil, err
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		if endpoint != "" {
			o.BaseEndpoint = aws.String(endpoint)
		}
	}), nil
}

// CreateDynamoTable creates the store's DynamoDB table unless it exists.
func CreateDynamoTable(ctx context.Context, st *Store) error {
	return dynamostore.CreateIfNotExists(ctx, st.DDB, st.DDBConfig)
}

// Redact hides a password in a DSN for messages.
func Redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
			return u.String()
		}
	}
	return dsn
}
