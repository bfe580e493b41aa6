package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	_ "github.com/glebarez/go-sqlite"  // the pure-Go "sqlite" driver
	_ "github.com/go-sql-driver/mysql" // the "mysql" driver
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver for PostgreSQL

	"github.com/outboxkit/outbox/store/sqlstore"
)

// database is the application's database: its orders table and the outbox tables
// live side by side, so one transaction can write both.
type database struct {
	name    string // what the walkthrough calls it
	dialect sqlstore.Dialect
	driver  string // the database/sql driver
	dsn     string
	orders  string          // the orders table
	config  sqlstore.Config // the outbox tables
	dropAll bool            // drop the tables at close (a shared server)
	tempDir string          // SQLite's directory, removed at close
	db      *sql.DB         // nil while "crashed"
	store   *sqlstore.Store // nil while "crashed"
}

// openDatabase opens the database opts choose and creates the tables.
func openDatabase(ctx context.Context, opts options) (*database, error) {
	d := &database{orders: "orders"}
	switch {
	case opts.Postgres != "":
		d.name, d.dialect, d.driver, d.dsn = "PostgreSQL", sqlstore.PostgreSQL, "pgx", opts.Postgres
		d.useOwnTables()
	case opts.MySQL != "":
		d.name, d.dialect, d.driver, d.dsn = "MySQL", sqlstore.MySQL, "mysql", opts.MySQL
		d.useOwnTables()
	default:
		dir, err := os.MkdirTemp("", "outbox-example-")
		if err != nil {
			return nil, err
		}
		d.name, d.dialect, d.driver, d.tempDir = "a SQLite file in a temporary directory", sqlstore.SQLite, "sqlite", dir
		// SQLite has one writer: immediate transactions and a busy timeout make a
		// writer wait for the lock instead of failing with SQLITE_BUSY.
		d.dsn = "file:" + filepath.Join(dir, "app.db") +
			"?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
	}
	if err := d.open(ctx); err != nil {
		return nil, errors.Join(err, d.close(ctx))
	}
	_, err := d.db.ExecContext(ctx, "CREATE TABLE "+d.orders+" (id VARCHAR(32) PRIMARY KEY)")
	if err == nil {
		err = d.store.Migrate(ctx)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%s: create tables: %w", d.name, err), d.close(ctx))
	}
	return d, nil
}

// useOwnTables gives this database tables of its own on a server others may share.
func (d *database) useOwnTables() {
	suffix := fmt.Sprintf("_%08x", rand.Uint32())
	d.orders = "example_orders" + suffix
	d.config.Table = "example_outbox" + suffix
	d.dropAll = true
}

// open connects and builds the outbox store on the connection.
func (d *database) open(ctx context.Context) error {
	db, err := sql.Open(d.driver, d.dsn)
	if err != nil {
		return fmt.Errorf("%s: %w", d.name, err)
	}
	if err := db.PingContext(ctx); err != nil {
		return errors.Join(fmt.Errorf("%s: connect: %w", d.name, err), db.Close())
	}
	store, err := sqlstore.NewDB(db, d.dialect, d.config)
	if err != nil {
		return errors.Join(err, db.Close())
	}
	d.db, d.store = db, store
	return nil
}

// crash drops the connection and the store the way a dying process does; only what
// was committed stays in the database.
func (d *database) crash() error {
	err := d.store.Close()
	err = errors.Join(err, d.db.Close())
	d.db, d.store = nil, nil
	return err
}

// restart opens the database again, as a restarted process would.
func (d *database) restart(ctx context.Context) error {
	if err := d.crash(); err != nil {
		return err
	}
	return d.open(ctx)
}

// saveOrder writes an order in a transaction of its own, as an application without
// the outbox does.
func (d *database) saveOrder(ctx context.Context, id string) error {
	_, err := d.db.ExecContext(ctx, d.insertOrder(), id)
	return err
}

// insertOrder is the statement that writes an order: PostgreSQL numbers its
// placeholders, MySQL and SQLite do not.
func (d *database) insertOrder() string {
	if d.dialect == sqlstore.PostgreSQL {
		return "INSERT INTO " + d.orders + " (id) VALUES ($1)"
	}
	return "INSERT INTO " + d.orders + " (id) VALUES (?)"
}

// savedOrders lists the orders in the database.
func (d *database) savedOrders(ctx context.Context) ([]string, error) {
	rows, err := d.db.QueryContext(ctx, "SELECT id FROM "+d.orders+" ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// close drops the tables on a shared server, or removes SQLite's directory, and
// disconnects.
func (d *database) close(ctx context.Context) error {
	var err error
	if d.store != nil && d.dropAll {
		_, dropErr := d.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+d.orders)
		err = errors.Join(dropErr, d.store.DropTables(ctx))
	}
	if d.store != nil {
		err = errors.Join(err, d.crash())
	}
	if d.tempDir != "" {
		err = errors.Join(err, os.RemoveAll(d.tempDir))
	}
	return err
}
