// Package storeconn opens the store a DSN names, for the project's programs
// (outboxctl and outbox-relay): both connect to a store the same way.
package storeconn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/glebarez/go-sqlite"  // the pure-Go "sqlite" driver
	_ "github.com/go-sql-driver/mysql" // the "mysql" driver
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/store/dynamostore"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// Options say which store to open.
type Options struct {
	// DSN names the store: postgres://… or postgresql://… (pgx), mysql://DSN (a
	// go-sql-driver DSN after the scheme), sqlite:PATH or file:PATH (a SQLite file),
	// dynamodb://TABLE.
	DSN string
	// Table is the SQL messages table ("" = the store's default).
	Table string
	// Buckets is the bucket count (0 = the store's default).
	Buckets int
	// Region and Endpoint reach DynamoDB (and SQS); empty = the SDK's defaults.
	Region, Endpoint string
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
}

var _ driver.Handle = (*Store)(nil)

// Driver returns the store's relay side.
func (s *Store) Driver() driver.Store { return s.Store }

// Close closes the store and the client it was opened on.
func (s *Store) Close() error { return s.closeAll() }

// ErrUsage marks an error in what the user asked for.
var ErrUsage = errors.New("usage")

// Open connects to the store opts names. It checks the connection.
func Open(ctx context.Context, opts Options) (*Store, error) {
	dsn := opts.DSN
	if dsn == "" {
		return nil, fmt.Errorf("%w: no store: pass -store (or set OUTBOX_STORE) to postgres://…, mysql://…, sqlite:PATH or dynamodb://TABLE", ErrUsage)
	}
	sqlCfg := sqlstore.Config{Table: opts.Table, BucketCount: opts.Buckets}
	scheme, rest, _ := strings.Cut(dsn, ":")
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		pool, err := pgxpool.New(ctx, dsn)
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
			return nil, err
		}
		return &Store{Store: st.Driver(), Kind: "postgres", SQL: st, closeAll: func() error {
			err := st.Close()
			pool.Close()
			return err
		}}, nil
	case "mysql", "mariadb":
		return openSQL(ctx, "mysql", sqlstore.MySQL, strings.TrimPrefix(rest, "//"), sqlCfg)
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
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("%w: dynamodb: name the table: dynamodb://TABLE", ErrUsage)
		}
		client, err := DynamoClient(ctx, opts.Region, opts.Endpoint)
		if err != nil {
			return nil, err
		}
		cfg := dynamostore.Config{TableName: u.Host, BucketCount: opts.Buckets}
		st, err := dynamostore.New(client, cfg)
		if err != nil {
			return nil, err
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
		return nil, err
	}
	kind := "mysql"
	if dialect == sqlstore.SQLite {
		kind = "sqlite"
	}
	return &Store{Store: st.Driver(), Kind: kind, SQL: st, closeAll: func() error {
		return errors.Join(st.Close(), db.Close())
	}}, nil
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
