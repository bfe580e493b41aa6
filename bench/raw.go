package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The business transaction every contender's writer runs: one order row.

func createOrdersPG(ctx context.Context, pool *pgxpool.Pool, table string) error {
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL, total BIGINT NOT NULL)")
	return err
}

func insertOrderPG(ctx context.Context, tx pgx.Tx, table string, order int64) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+table+" (customer, total) VALUES ($1, $2)", fmt.Sprintf("customer-%d", order%1000), order)
	return err
}

func dropPG(ctx context.Context, pool *pgxpool.Pool, tables ...string) error {
	_, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+strings.Join(tables, ", "))
	return err
}

// business is the baseline: the business transaction alone.
type businessPG struct {
	r      *run
	orders string
}

func openBusinessPG(ctx context.Context, r *run) (instance, error) {
	b := &businessPG{r: r, orders: "bench_orders_" + r.sfx}
	return b, createOrdersPG(ctx, r.env.pg, b.orders)
}

func (b *businessPG) write(ctx context.Context, order int64, _ []message) (time.Time, error) {
	err := pgx.BeginFunc(ctx, b.r.env.pg, func(tx pgx.Tx) error { return insertOrderPG(ctx, tx, b.orders, order) })
	return time.Now(), err
}

func (b *businessPG) fill(context.Context, pgx.Tx, []message) (func(), error) {
	return nil, errors.New("no queue")
}
func (b *businessPG) queue() string { return "" }
func (b *businessPG) relay(context.Context, int) (runningRelay, error) {
	return nil, errors.New("the business transaction has no relay")
}
func (b *businessPG) close(ctx context.Context) error { return dropPG(ctx, b.r.env.pg, b.orders) }

// rawPG is the hand-written relay: one table, SELECT … FOR UPDATE SKIP LOCKED,
// produce, DELETE, COMMIT.
type rawPGInstance struct {
	r      *run
	orders string
	table  string
}

func openRawPG(ctx context.Context, r *run) (instance, error) {
	x := &rawPGInstance{r: r, orders: "bench_orders_" + r.sfx, table: "bench_raw_" + r.sfx}
	if err := createOrdersPG(ctx, r.env.pg, x.orders); err != nil {
		return nil, err
	}
	_, err := r.env.pg.Exec(ctx, "CREATE TABLE "+x.table+" (id BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, msg_key BYTEA NOT NULL, payload BYTEA NOT NULL)")
	return x, err
}

// insertValues is "($1,$2,$3),($4,$5,$6),…" for n rows of three columns, with the
// placeholder of the dialect.
func insertValues(n int, placeholder func(i int) string) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "(%s,%s,%s)", placeholder(3*i+1), placeholder(3*i+2), placeholder(3*i+3))
	}
	return b.String()
}

func dollar(i int) string { return fmt.Sprintf("$%d", i) }
func question(int) string { return "?" }

// rawArgs are the INSERT's arguments: one multi-row INSERT for all of a
// transaction's messages, the cheapest a hand-written writer can do.
func rawArgs(topic string, msgs []message) []any {
	args := make([]any, 0, 3*len(msgs))
	for _, m := range msgs {
		args = append(args, topic, m.key, m.payload)
	}
	return args
}

func (x *rawPGInstance) write(ctx context.Context, order int64, msgs []message) (time.Time, error) {
	err := pgx.BeginFunc(ctx, x.r.env.pg, func(tx pgx.Tx) error {
		if err := insertOrderPG(ctx, tx, x.orders, order); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+x.table+" (topic, msg_key, payload) VALUES "+insertValues(len(msgs), dollar), rawArgs(x.r.topic, msgs)...)
		return err
	})
	return time.Now(), err
}

func (x *rawPGInstance) fill(ctx context.Context, tx pgx.Tx, msgs []message) (func(), error) {
	rows := make([][]any, len(msgs))
	for i, m := range msgs {
		rows[i] = []any{x.r.topic, m.key, m.payload}
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{x.table}, []string{"topic", "msg_key", "payload"}, pgx.CopyFromRows(rows))
	return nil, err
}

func (x *rawPGInstance) queue() string { return x.table }

func (x *rawPGInstance) close(ctx context.Context) error {
	return dropPG(ctx, x.r.env.pg, x.orders, x.table)
}

func (x *rawPGInstance) relay(ctx context.Context, batch int) (runningRelay, error) {
	pool, err := openPostgres(ctx, 2)
	if err != nil {
		return nil, err
	}
	client, err := x.r.broker.client()
	if err != nil {
		pool.Close()
		return nil, err
	}
	sel := "SELECT id, topic, msg_key, payload FROM " + x.table + " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
	del := "DELETE FROM " + x.table + " WHERE id = ANY($1)"
	round := func(ctx context.Context) (int, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(context.WithoutCancel(ctx))
		rows, err := tx.Query(ctx, sel, batch)
		if err != nil {
			return 0, err
		}
		defer rows.Close()
		var ids []int64
		var recs []*kgo.Record
		for rows.Next() {
			var id int64
			r := &kgo.Record{}
			if err := rows.Scan(&id, &r.Topic, &r.Key, &r.Value); err != nil {
				return 0, err
			}
			ids, recs = append(ids, id), append(recs, r)
		}
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if len(ids) == 0 {
			return 0, nil
		}
		if err := client.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return 0, err
		}
		if _, err := tx.Exec(ctx, del, ids); err != nil {
			return 0, err
		}
		return len(ids), tx.Commit(ctx)
	}
	return startLoop(ctx, round, func() { client.Close(); pool.Close() }), nil
}

// loop runs a raw relay's rounds until stopped, polling every 10 ms when a round
// finds nothing.
type loop struct {
	cancel  context.CancelFunc
	done    chan struct{}
	cleanup func()
	once    sync.Once
}

const rawPoll = 10 * time.Millisecond

func startLoop(ctx context.Context, round func(context.Context) (int, error), cleanup func()) *loop {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &loop{cancel: cancel, done: make(chan struct{}), cleanup: cleanup}
	go func() {
		defer close(l.done)
		for ctx.Err() == nil {
			n, err := round(ctx)
			if err != nil && ctx.Err() == nil {
				say("  raw relay: %v (retrying)", err)
			}
			if n == 0 {
				select {
				case <-ctx.Done():
				case <-time.After(rawPoll):
				}
			}
		}
	}()
	return l
}

func (l *loop) held() int { return -1 }

func (l *loop) stop(context.Context) error {
	l.once.Do(func() {
		l.cancel()
		<-l.done
		l.cleanup()
	})
	return nil
}

// The same relay on MariaDB, through database/sql.

func createOrdersMy(ctx context.Context, db *sql.DB, table string) error {
	_, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, customer VARCHAR(100) NOT NULL, total BIGINT NOT NULL) ENGINE=InnoDB")
	return err
}

func insertOrderMy(ctx context.Context, tx *sql.Tx, table string, order int64) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (customer, total) VALUES (?, ?)", fmt.Sprintf("customer-%d", order%1000), order)
	return err
}

func dropMy(ctx context.Context, db *sql.DB, tables ...string) error {
	_, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS "+strings.Join(tables, ", "))
	return err
}

func txMy(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

type businessMyInstance struct {
	r      *run
	orders string
}

func openBusinessMy(ctx context.Context, r *run) (instance, error) {
	b := &businessMyInstance{r: r, orders: "bench_orders_" + r.sfx}
	return b, createOrdersMy(ctx, r.env.mysql, b.orders)
}

func (b *businessMyInstance) write(ctx context.Context, order int64, _ []message) (time.Time, error) {
	err := txMy(ctx, b.r.env.mysql, func(tx *sql.Tx) error { return insertOrderMy(ctx, tx, b.orders, order) })
	return time.Now(), err
}

func (b *businessMyInstance) fill(context.Context, pgx.Tx, []message) (func(), error) {
	return nil, errors.New("no queue")
}
func (b *businessMyInstance) queue() string { return "" }
func (b *businessMyInstance) relay(context.Context, int) (runningRelay, error) {
	return nil, errors.New("the business transaction has no relay")
}
func (b *businessMyInstance) close(ctx context.Context) error {
	return dropMy(ctx, b.r.env.mysql, b.orders)
}

type rawMyInstance struct {
	r      *run
	orders string
	table  string
}

func openRawMy(ctx context.Context, r *run) (instance, error) {
	x := &rawMyInstance{r: r, orders: "bench_orders_" + r.sfx, table: "bench_raw_" + r.sfx}
	if err := createOrdersMy(ctx, r.env.mysql, x.orders); err != nil {
		return nil, err
	}
	_, err := r.env.mysql.ExecContext(ctx, "CREATE TABLE "+x.table+" (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, topic VARCHAR(255) NOT NULL, msg_key VARBINARY(255) NOT NULL, payload BLOB NOT NULL) ENGINE=InnoDB")
	return x, err
}

func (x *rawMyInstance) write(ctx context.Context, order int64, msgs []message) (time.Time, error) {
	err := txMy(ctx, x.r.env.mysql, func(tx *sql.Tx) error {
		if err := insertOrderMy(ctx, tx, x.orders, order); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, "INSERT INTO "+x.table+" (topic, msg_key, payload) VALUES "+insertValues(len(msgs), question), rawArgs(x.r.topic, msgs)...)
		return err
	})
	return time.Now(), err
}

func (x *rawMyInstance) fill(context.Context, pgx.Tx, []message) (func(), error) {
	return nil, errors.New("not used")
}
func (x *rawMyInstance) queue() string { return x.table }
func (x *rawMyInstance) close(ctx context.Context) error {
	return dropMy(ctx, x.r.env.mysql, x.orders, x.table)
}

func (x *rawMyInstance) relay(ctx context.Context, batch int) (runningRelay, error) {
	db, err := openMySQL(ctx, 2)
	if err != nil {
		return nil, err
	}
	client, err := x.r.broker.client()
	if err != nil {
		db.Close()
		return nil, err
	}
	sel := "SELECT id, topic, msg_key, payload FROM " + x.table + " ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED"
	round := func(ctx context.Context) (int, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback()
		rows, err := tx.QueryContext(ctx, sel, batch)
		if err != nil {
			return 0, err
		}
		var ids []any
		var recs []*kgo.Record
		for rows.Next() {
			var id int64
			r := &kgo.Record{}
			if err := rows.Scan(&id, &r.Topic, &r.Key, &r.Value); err != nil {
				rows.Close()
				return 0, err
			}
			ids, recs = append(ids, id), append(recs, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
		if len(ids) == 0 {
			return 0, nil
		}
		if err := client.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return 0, err
		}
		if _, err := tx.ExecContext(ctx, "DELETE FROM "+x.table+" WHERE id IN (?"+strings.Repeat(",?", len(ids)-1)+")", ids...); err != nil {
			return 0, err
		}
		return len(ids), tx.Commit()
	}
	return startLoop(ctx, round, func() { client.Close(); db.Close() }), nil
}
