package main

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/middleware"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
	"github.com/twmb/franz-go/pkg/kgo"
)

// outboxInstance is the project itself: a store and a sender on the writers' side,
// relays on stores of their own (so wake-ups travel through NOTIFY on
// PostgreSQL, as between processes).
type outboxInstance struct {
	r        *run
	orders   string
	cfg      sqlstore.Config
	store    *sqlstore.Store
	client   *kgo.Client // never produces: the sender learns the transport's limits from it
	sender   outbox.Sender
	transact bool // write through store.Transact instead of the application's own transaction
	mysql    bool
}

func (o *outboxInstance) init(ctx context.Context) error {
	var err error
	if o.client, err = o.r.broker.client(); err != nil {
		return err
	}
	transport, err := kafkatransport.New(o.client, kafkatransport.Config{})
	if err != nil {
		return err
	}
	capture, err := outbox.NewSender(o.store, outbox.SenderConfig{Transport: transport})
	if err != nil {
		return err
	}
	// The application sends through a route of the middleware, as in the docs.
	router := middleware.NewRouter()
	router.Handle(o.r.topic, capture)
	o.sender = router
	return o.store.Migrate(ctx)
}

func openOutboxPG(ctx context.Context, r *run) (instance, error) {
	o := &outboxInstance{r: r, orders: "bench_orders_" + r.sfx, cfg: sqlstore.Config{Table: "bench_outbox_" + r.sfx, Logger: quiet}}
	if err := createOrdersPG(ctx, r.env.pg, o.orders); err != nil {
		return nil, err
	}
	var err error
	if o.store, err = sqlstore.NewPgx(r.env.pg, o.cfg); err != nil {
		return nil, err
	}
	return o, o.init(ctx)
}

// openOutboxLog is the PostgreSQL store in log mode: the same documented write
// path, the messages going into the write-ahead log instead of the table, and the
// relay reading them from the store's replication slot.
func openOutboxLog(ctx context.Context, r *run) (instance, error) {
	o := &outboxInstance{r: r, orders: "bench_orders_" + r.sfx, cfg: sqlstore.Config{Table: "bench_outbox_" + r.sfx, Mode: sqlstore.LogMode, Logger: quiet}}
	if err := createOrdersPG(ctx, r.env.pg, o.orders); err != nil {
		return nil, err
	}
	var err error
	if o.store, err = sqlstore.NewPgx(r.env.pg, o.cfg); err != nil {
		return nil, err
	}
	return &outboxLogInstance{o}, o.init(ctx)
}

// outboxLogInstance is the outbox in log mode, a streamingInstance.
type outboxLogInstance struct{ *outboxInstance }

// streaming implements streamingInstance: whether a reader has the store's slot
// open.
func (o *outboxLogInstance) streaming(ctx context.Context) (bool, error) {
	var active bool
	err := o.r.env.pg.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", o.store.Config().Slot).Scan(&active)
	return active, err
}

// lag implements streamingInstance: the WAL bytes between the current position
// and the slot's confirmed one.
func (o *outboxLogInstance) lag(ctx context.Context) (int64, error) {
	var n int64
	err := o.r.env.pg.QueryRow(ctx, "SELECT COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn), 0)::bigint FROM pg_replication_slots WHERE slot_name = $1",
		o.store.Config().Slot).Scan(&n)
	return n, err
}

func openOutboxTransact(ctx context.Context, r *run) (instance, error) {
	in, err := openOutboxPG(ctx, r)
	if in != nil {
		in.(*outboxInstance).transact = true
	}
	return in, err
}

func openOutboxMy(ctx context.Context, r *run) (instance, error) {
	o := &outboxInstance{r: r, orders: "bench_orders_" + r.sfx, cfg: sqlstore.Config{Table: "bench_outbox_" + r.sfx, Logger: quiet}, mysql: true}
	if err := createOrdersMy(ctx, r.env.mysql, o.orders); err != nil {
		return nil, err
	}
	var err error
	if o.store, err = sqlstore.NewDB(r.env.mysql, sqlstore.MySQL, o.cfg); err != nil {
		return nil, err
	}
	return o, o.init(ctx)
}

func (o *outboxInstance) send(ctx context.Context, msgs []message) error {
	for _, m := range msgs {
		if err := o.sender.Send(ctx, outbox.Message{Topic: o.r.topic, Key: m.key, Payload: m.payload}); err != nil {
			return err
		}
	}
	return nil
}

// write is the documented path for a transaction the application manages: a
// scope, the business row, the sends, EnqueuePgxTx (or EnqueueTx), the commit,
// then NotifyCommitted. With transact, the unit of work does all of it.
func (o *outboxInstance) write(ctx context.Context, order int64, msgs []message) (time.Time, error) {
	if o.transact {
		err := o.store.Transact(ctx, func(ctx context.Context) error {
			tx, _ := sqlstore.PgxTx(ctx)
			if err := insertOrderPG(ctx, tx, o.orders, order); err != nil {
				return err
			}
			return o.send(ctx, msgs)
		})
		return time.Now(), err
	}
	ctx, scope := outbox.NewScope(ctx)
	defer scope.Release()
	if o.mysql {
		return o.writeMy(ctx, order, msgs)
	}
	tx, err := o.r.env.pg.Begin(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := insertOrderPG(ctx, tx, o.orders, order); err != nil {
		return time.Time{}, err
	}
	if err := o.send(ctx, msgs); err != nil {
		return time.Time{}, err
	}
	written, err := o.store.EnqueuePgxTx(ctx, tx)
	if err != nil {
		return time.Time{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, err
	}
	committed := time.Now()
	o.store.NotifyCommitted(written...)
	return committed, nil
}

func (o *outboxInstance) writeMy(ctx context.Context, order int64, msgs []message) (time.Time, error) {
	tx, err := o.r.env.mysql.BeginTx(ctx, nil)
	if err != nil {
		return time.Time{}, err
	}
	defer tx.Rollback()
	if err := insertOrderMy(ctx, tx, o.orders, order); err != nil {
		return time.Time{}, err
	}
	if err := o.send(ctx, msgs); err != nil {
		return time.Time{}, err
	}
	written, err := o.store.EnqueueTx(ctx, tx)
	if err != nil {
		return time.Time{}, err
	}
	if err := tx.Commit(); err != nil {
		return time.Time{}, err
	}
	committed := time.Now()
	o.store.NotifyCommitted(written...)
	return committed, nil
}

// fill writes the backlog into tx with EnqueuePgxTx, 2,000 messages per call, and
// announces it once committed.
func (o *outboxInstance) fill(ctx context.Context, tx pgx.Tx, msgs []message) (func(), error) {
	var written []*driver.Envelope
	for len(msgs) > 0 {
		n := min(len(msgs), 2000)
		batch := make([]outbox.Message, n)
		for i, m := range msgs[:n] {
			batch[i] = outbox.Message{Topic: o.r.topic, Key: m.key, Payload: m.payload}
		}
		w, err := o.store.EnqueuePgxTx(ctx, tx, batch...)
		if err != nil {
			return nil, err
		}
		written = append(written, w...)
		msgs = msgs[n:]
	}
	return func() { o.store.NotifyCommitted(written...) }, nil
}

func (o *outboxInstance) queue() string { return o.store.Config().Table }

func (o *outboxInstance) close(ctx context.Context) error {
	err := errors.Join(o.store.DropTables(ctx), o.store.Close())
	if o.client != nil {
		o.client.Close()
	}
	if o.mysql {
		return errors.Join(err, dropMy(ctx, o.r.env.mysql, o.orders))
	}
	return errors.Join(err, dropPG(ctx, o.r.env.pg, o.orders))
}

// relay starts a relay with the project's Kafka transport and default settings
// but BatchSize, on a store and connections of its own.
func (o *outboxInstance) relay(ctx context.Context, batch int) (runningRelay, error) {
	r := &outboxRelay{}
	var err error
	if o.mysql {
		var db *sql.DB
		if db, err = openMySQL(ctx, 4); err != nil {
			return nil, err
		}
		r.closers = append(r.closers, db.Close)
		r.store, err = sqlstore.NewDB(db, sqlstore.MySQL, o.cfg)
	} else {
		var pool *pgxpool.Pool
		if pool, err = openPostgres(ctx, 4); err != nil {
			return nil, err
		}
		r.closers = append(r.closers, func() error { pool.Close(); return nil })
		r.store, err = sqlstore.NewPgx(pool, o.cfg)
	}
	if err != nil {
		r.close()
		return nil, err
	}
	r.closers = append(r.closers, r.store.Close)
	client, err := o.r.broker.client()
	if err != nil {
		r.close()
		return nil, err
	}
	r.closers = append(r.closers, func() error { client.Close(); return nil })
	transport, err := kafkatransport.New(client, kafkatransport.Config{})
	if err != nil {
		r.close()
		return nil, err
	}
	if r.d, err = relay.New(r.store, transport, relay.Config{BatchSize: batch, Logger: quiet}); err != nil {
		r.close()
		return nil, err
	}
	if err := r.d.Start(context.WithoutCancel(ctx)); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

type outboxRelay struct {
	store   *sqlstore.Store
	d       *relay.Relay
	closers []func() error
}

func (r *outboxRelay) held() int { return len(r.d.Owned()) }

func (r *outboxRelay) stop(ctx context.Context) error {
	return errors.Join(r.d.Stop(ctx), r.close())
}

// close runs the closers last-opened first.
func (r *outboxRelay) close() error {
	var errs []error
	for i := len(r.closers) - 1; i >= 0; i-- {
		errs = append(errs, r.closers[i]())
	}
	r.closers = nil
	return errors.Join(errs...)
}
