package main

import (
	"bufio"
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox/internal/pgcluster"
)

// progress is where the scenarios say what they are doing.
var progress io.Writer = os.Stderr

func say(format string, args ...any) { fmt.Fprintf(progress, format+"\n", args...) }

// quiet is the logger of the stores and relays: warnings and errors only.
var quiet = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// pgURL is the PostgreSQL every scenario runs on: the -postgres flag's, or that of
// the cluster runAll starts (startPostgres).
var pgURL string

func postgresURL() string { return pgURL }

// startPostgres starts the cluster of the bench's own: initdb into a temporary
// directory, PostgreSQL's default settings but those the log mode needs
// (wal_level=logical, replication slots and WAL senders), on a free port of
// 127.0.0.1. Every PostgreSQL contender runs on it, table and log mode alike.
func startPostgres() (url string, stop func(), err error) {
	c, err := pgcluster.New(pgcluster.Logical)
	if err != nil {
		return "", nil, fmt.Errorf("starting a PostgreSQL cluster with wal_level=logical (or give one with -postgres): %w", err)
	}
	return c.URL("postgres"), c.Remove, nil
}

// checkLogical refuses a server the log-mode contender cannot run on.
func checkLogical(ctx context.Context, pool *pgxpool.Pool) error {
	var level string
	if err := pool.QueryRow(ctx, "SELECT current_setting('wal_level')").Scan(&level); err != nil {
		return err
	}
	if level != "logical" {
		return fmt.Errorf("PostgreSQL at %s has wal_level=%s: the log-mode contender needs wal_level=logical; give -postgres a server that has it, or leave -postgres out and the bench starts a cluster of its own", redact(postgresURL()), level)
	}
	return nil
}

func mysqlDSN() string {
	return cmp.Or(os.Getenv("OUTBOX_TEST_MYSQL_DSN"), "root@tcp(127.0.0.1:3306)/test?parseTime=true&loc=UTC")
}

// env holds the databases every run shares: the writers' pool on PostgreSQL and
// database on MariaDB. Relays open their own.
type env struct {
	pg       *pgxpool.Pool
	pgSource string  // where the server came from, for the report
	mysql    *sql.DB // nil when the MariaDB scenarios are not run
}

// writerPool opens PostgreSQL with room for eight concurrent writers.
func openPostgres(ctx context.Context, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(postgresURL())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("PostgreSQL at %s: %w", redact(postgresURL()), err)
	}
	return pool, nil
}

func openMySQL(ctx context.Context, conns int) (*sql.DB, error) {
	db, err := sql.Open("mysql", mysqlDSN())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("MariaDB: %w", err)
	}
	return db, nil
}

// redact drops a password from a URL before it is printed.
func redact(u string) string {
	if at := strings.LastIndex(u, "@"); at > 0 {
		if scheme := strings.Index(u, "://"); scheme > 0 && scheme < at {
			if colon := strings.Index(u[scheme+3:at], ":"); colon >= 0 {
				return u[:scheme+3+colon] + ":…" + u[at:]
			}
		}
	}
	return u
}

// suffix names one run's tables and topic.
func suffix() string {
	return fmt.Sprintf("%d_%04x", time.Now().UnixMilli()%1e9, rand.IntN(1<<16))
}

// machine describes what the figures were measured on, read at run time.
type machine struct {
	CPU, Go, Postgres, PostgresDurability, PostgresSource, MariaDB, MariaDBDurability string
	Cores                                                                             int
}

func describe(ctx context.Context, e *env) machine {
	m := machine{CPU: cpuModel(), Cores: runtime.NumCPU(), Go: runtime.Version()}
	var version, fsync, syncCommit, walLevel, buffers string
	if err := e.pg.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('fsync'), current_setting('synchronous_commit'), current_setting('wal_level'), current_setting('shared_buffers')").Scan(&version, &fsync, &syncCommit, &walLevel, &buffers); err == nil {
		m.Postgres = version
		m.PostgresDurability = fmt.Sprintf("fsync %s, synchronous_commit %s, wal_level %s, shared_buffers %s", fsync, syncCommit, walLevel, buffers)
	}
	m.PostgresSource = e.pgSource
	if e.mysql != nil {
		var flush string
		if err := e.mysql.QueryRowContext(ctx, "SELECT VERSION(), @@innodb_flush_log_at_trx_commit").Scan(&version, &flush); err == nil {
			m.MariaDB = version
			m.MariaDBDurability = "innodb_flush_log_at_trx_commit " + flush
		}
	}
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return runtime.GOARCH
}
