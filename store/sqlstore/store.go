package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Store is an outbox store on one set of SQL tables. Applications send into it
// ([outbox.NewSender]), run units of work on it ([Store.Transact]) and write into
// their own transactions with it ([Store.EnqueuePgxTx], [Store.EnqueueTx]); relays
// and tools reach its relay side through [Store.Driver]. It is safe for concurrent
// use.
type Store struct {
	cfg     Config
	dialect Dialect
	stmts   statements
	db      querier // the pool or *sql.DB, for statements outside a caller's transaction

	pool     *pgxpool.Pool
	sqlDB    *sql.DB
	beginner Beginner // NewORM: begins the units' transactions

	idle idleWatch // database/sql: warns when the pool keeps too few idle connections

	hub      driver.Hub
	buckets  bucketCheck
	logw     logWrite // LogMode: the slot was there at the first write
	closed   atomic.Bool
	sender   notifySender
	vacuum   vacuumer
	prepared preparedInserts // MySQL
	origin   string          // tags this store's NOTIFY payloads, so its listener skips them

	listenMu     sync.Mutex
	listenCancel context.CancelFunc
	listenDone   chan struct{}
}

// driverStore is the store's relay side: a [driver.Store] that also implements
// [driver.Admin], [driver.Notifier], [driver.Finder], [driver.Retainer] and the
// inbox's key store ([inbox.Store], [inbox.Remover]).
type driverStore struct{ *Store }

var (
	_ outbox.Store       = (*Store)(nil)
	_ driver.Handle      = (*Store)(nil)
	_ driver.SizeLimiter = (*Store)(nil)
	_ driver.Store       = driverStore{}
	_ driver.Admin       = driverStore{}
	_ driver.Notifier    = driverStore{}
	_ driver.Finder      = driverStore{}
	_ driver.Retainer    = driverStore{}
)

// Driver returns the store's relay side, for relays
// ([github.com/outboxkit/outbox/relay.New] takes the store and calls it), the inbox
// and tools: the queue, the leases, the admin surface ([driver.Admin]), wake-ups
// ([driver.Notifier]), lookups ([driver.Finder]) and retention ([driver.Retainer]).
// Applications do not call it.
//
// In LogMode the relay side also implements [driver.Streamer]: the relay then reads
// the slot. In TableMode it does not.
func (s *Store) Driver() driver.Store {
	if s.logMode() {
		return logDriverStore{driverStore{s}}
	}
	return driverStore{s}
}

// NewPgx returns a PostgreSQL store on a pgx pool the caller built. Inside
// [Store.Transact], [PgxTx] reaches the unit's transaction; a transaction the
// application manages takes the staged messages with [Store.EnqueuePgxTx].
func NewPgx(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: sqlstore: NewPgx needs a *pgxpool.Pool", outbox.ErrMisconfigured)
	}
	s, err := newStore(PostgreSQL, cfg)
	if err != nil {
		return nil, err
	}
	s.pool = pool
	s.db = pgxQuerier{pool}
	return s, nil
}

// NewDB returns a store on a *sql.DB the caller opened, for the given dialect. Inside
// [Store.Transact], [SQLTx] reaches the unit's transaction; a transaction the
// application manages takes the staged messages with [Store.EnqueueTx].
//
// SQLite needs a DSN that makes concurrent writers wait rather than fail:
// _txlock=immediate, _pragma=busy_timeout(5000) and _pragma=journal_mode(WAL)
// (see the package documentation).
//
// A relay uses several connections at once (drains and lease writes each run up
// to the dispatcher's MaxConcurrency at once, and NOTIFY), but database/sql keeps
// only 2 idle by default and closes every other connection as it is returned: each
// call then opens a new session and prepares its statement again, and the relay
// drains several times slower. Let the pool keep enough: db.SetMaxIdleConns(n) with
// n at least 2 × MaxConcurrency + 2 (10 with the dispatcher's defaults), or equal
// to db.SetMaxOpenConns. The store leaves the settings of db alone and logs a
// warning when it sees the pool closing connections this way.
func NewDB(db *sql.DB, dialect Dialect, cfg Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlstore: NewDB needs a *sql.DB", outbox.ErrMisconfigured)
	}
	s, err := newStore(dialect, cfg)
	if err != nil {
		return nil, err
	}
	s.sqlDB = db
	s.db = sqlQuerier{db}
	return s, nil
}

// Beginner begins the transaction of each unit of work of a store built with
// [NewORM]. It is the extension point for an ORM on database/sql, which begins its
// transactions through its own API and hands the application its own object for
// them; package gormstore (store/sqlstore/gormstore) is the one for gorm.
//
// A Beginner may also have a method As(target any) bool, which [Store.As] calls for
// a target it does not take itself: the ORM's handle of the database, say.
type Beginner interface {
	// BeginTx begins a transaction with opts (nil when the unit's ctx carries no
	// [WithTxOptions]). The unit writes its messages in tx, takes its savepoints in
	// it, and commits or rolls tx back itself. handle is the ORM's own object for tx:
	// the ORM packages of this module (gormstore) hand it to applications through
	// their typed accessor; an ORM package of another module returns nil and builds
	// its accessor on [SQLTx]. On error BeginTx leaves no transaction open.
	BeginTx(ctx context.Context, opts *sql.TxOptions) (tx *sql.Tx, handle any, err error)
}

// NewORM returns a store on a *sql.DB, for the given dialect, whose units of work
// begin their transactions with begin instead of db.BeginTx: everything else (the
// relay side, Enqueue, [Store.EnqueueTx]) runs on db, as with [NewDB]. Inside
// [Store.Transact], [SQLTx] reaches the unit's *sql.Tx (and the ORM package's
// accessor its own object for it). Applications call an ORM package's constructor,
// such as gormstore.New, rather than NewORM.
func NewORM(db *sql.DB, dialect Dialect, begin Beginner, cfg Config) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: sqlstore: NewORM needs a *sql.DB", outbox.ErrMisconfigured)
	}
	if begin == nil {
		return nil, fmt.Errorf("%w: sqlstore: NewORM needs a Beginner; without one use NewDB", outbox.ErrMisconfigured)
	}
	s, err := NewDB(db, dialect, cfg)
	if err != nil {
		return nil, err
	}
	s.beginner = begin
	return s, nil
}

func newStore(d Dialect, cfg Config) (*Store, error) {
	if d != PostgreSQL && d != MySQL && d != SQLite {
		return nil, fmt.Errorf("%w: sqlstore: unknown dialect %v: use PostgreSQL, MySQL or SQLite", outbox.ErrMisconfigured, d)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if cfg.Mode == LogMode && d != PostgreSQL {
		return nil, fmt.Errorf("%w: sqlstore: Config.Mode LogMode needs PostgreSQL (its write-ahead log); a %v store has TableMode only", outbox.ErrMisconfigured, d)
	}
	if d == SQLite && (strings.Contains(cfg.Table, ".") || strings.Contains(cfg.LeaseTable, ".") || strings.Contains(cfg.RelayTable, ".")) {
		return nil, fmt.Errorf("%w: sqlstore: Config.Table %q: SQLite table names cannot be schema-qualified here", outbox.ErrMisconfigured, cfg.Table)
	}
	return &Store{
		cfg: cfg, dialect: d, stmts: newStatements(d, cfg),
		origin: strings.ReplaceAll(uuid.NewString(), "-", "")[:12],
	}, nil
}

// Dialect is the store's SQL dialect.
func (s *Store) Dialect() Dialect { return s.dialect }

// BucketCount implements [driver.Store].
func (s driverStore) BucketCount() int { return s.cfg.BucketCount }

// MaxMessageSize is the largest [outbox.Message.Size] the store accepts
// ([Config.MaxMessageSize]); a sender built on the store refuses larger messages
// before anything is written.
func (s *Store) MaxMessageSize() int { return s.cfg.MaxMessageSize }

// As reaches the client the store was built on: target may be a **pgxpool.Pool or
// **sql.DB. On a store built with [NewORM], any other target goes to the
// [Beginner]'s As method, if it has one (a gorm store takes **gorm.DB).
func (s *Store) As(target any) bool {
	switch t := target.(type) {
	case **pgxpool.Pool:
		*t = s.pool
		return s.pool != nil
	case **sql.DB:
		*t = s.sqlDB
		return s.sqlDB != nil
	}
	if a, ok := s.beginner.(interface{ As(target any) bool }); ok {
		return a.As(target)
	}
	return false
}

// Close stops the LISTEN connection, if any, and closes every subscription. It does
// not close the caller's client. Later calls return [outbox.ErrClosed].
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.stopListener()
	s.sender.stop()
	s.vacuum.stop()
	s.prepared.close()
	s.hub.Close()
	return nil
}

func (s *Store) checkOpen() error {
	if s.closed.Load() {
		return fmt.Errorf("%w: sqlstore: store is closed", outbox.ErrClosed)
	}
	return nil
}

// begin checks the store is open and ctx is live.
func (s *Store) begin(ctx context.Context) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	return ctx.Err()
}

// wrap is the one place backend errors are translated: context errors come back
// unwrapped, a missing table or column wraps [outbox.ErrMisconfigured] and says to
// migrate, everything else names the operation.
func (s *Store) wrap(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, context.Canceled) {
		return context.Canceled
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return context.DeadlineExceeded
	}
	if missingSchema(err) {
		return fmt.Errorf("sqlstore: %s: %w: a table or column of the store does not exist (Config.Table %q, LeaseTable %q, RelayTable %q): run Store.Migrate at start-up, or apply the statements of Store.DDL, before using the store: %w",
			op, outbox.ErrMisconfigured, s.cfg.Table, s.cfg.LeaseTable, s.cfg.RelayTable, err)
	}
	return fmt.Errorf("sqlstore: %s: %w", op, err)
}

// missingSchema reports an error that says a table or column does not exist, which
// is what a schema behind the code's migrations gives: SQLSTATE 42P01 and 42703 on
// PostgreSQL, errors 1146 and 1054 on MySQL and MariaDB, "no such table", "no such
// column" and "has no column named" on SQLite.
func missingSchema(err error) bool {
	var state interface{ SQLState() string }
	if errors.As(err, &state) && (state.SQLState() == "42P01" || state.SQLState() == "42703") {
		return true
	}
	msg := err.Error()
	for _, sign := range []string{"Error 1146", "Error 1054", "no such table", "no such column", "has no column named"} {
		if strings.Contains(msg, sign) {
			return true
		}
	}
	return false
}

// check validates envelopes before anything is written.
func (s *Store) check(envs []*driver.Envelope) error {
	for i, env := range envs {
		if env == nil {
			return fmt.Errorf("%w: sqlstore: envelope %d is nil", outbox.ErrInvalidMessage, i)
		}
		if env.ID == uuid.Nil {
			return fmt.Errorf("%w: sqlstore: envelope %d has no ID: build envelopes with driver.NewEnvelope", outbox.ErrInvalidMessage, i)
		}
		if env.BucketCount != s.cfg.BucketCount {
			return fmt.Errorf("%w: sqlstore: envelope %s was built for %d buckets, the store has %d", outbox.ErrMisconfigured, env.ID, env.BucketCount, s.cfg.BucketCount)
		}
		if env.Bucket < 0 || env.Bucket >= s.cfg.BucketCount {
			return fmt.Errorf("%w: sqlstore: envelope %s has bucket %d outside [0, %d)", outbox.ErrInvalidMessage, env.ID, env.Bucket, s.cfg.BucketCount)
		}
		if err := env.Validate(); err != nil {
			return fmt.Errorf("sqlstore: envelope %s: %w", env.ID, err)
		}
		if n := env.Size(); n > s.cfg.MaxMessageSize {
			return fmt.Errorf("%w: sqlstore: message %s is %d bytes, the limit is %d (Config.MaxMessageSize)", outbox.ErrTooLarge, env.ID, n, s.cfg.MaxMessageSize)
		}
	}
	return nil
}

// Enqueue writes msgs now, all or nothing, in a transaction of its own, and wakes
// the dispatchers: one multi-row INSERT (several, in one transaction, beyond the
// dialect's bind-parameter limit). A message with a zero ID gets a UUIDv7. Every
// message is checked before any SQL runs; a refused call writes nothing.
//
// In LogMode it writes them into the write-ahead log instead, with one statement
// that is its own transaction, and no row.
func (s *Store) Enqueue(ctx context.Context, msgs ...outbox.Message) error {
	envs, err := s.envelopes(msgs)
	if err != nil {
		return err
	}
	if s.logMode() {
		return s.enqueueLog(ctx, envs)
	}
	return s.enqueue(ctx, envs)
}

// envelopes builds pending envelopes for msgs.
func (s *Store) envelopes(msgs []outbox.Message) ([]*driver.Envelope, error) {
	envs, err := driver.NewEnvelopes(msgs, s.cfg.BucketCount)
	if err != nil {
		return nil, fmt.Errorf("sqlstore: %w", err)
	}
	return envs, nil
}

// Enqueue implements [driver.Store]: it writes envelopes as [Store.Enqueue] writes
// messages, and sets their Seq. It writes rows in LogMode too: it is the table lane
// the relay moves messages to whose publish keeps failing.
func (s driverStore) Enqueue(ctx context.Context, envs ...*driver.Envelope) error {
	return s.enqueue(ctx, envs)
}

func (s *Store) enqueue(ctx context.Context, envs []*driver.Envelope) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if err := s.check(envs); err != nil {
		return err
	}
	if len(envs) == 0 {
		return nil
	}
	var err error
	if len(envs) <= maxRows(s.dialect) {
		err = s.insert(ctx, s.db, envs)
	} else {
		err = s.inTx(ctx, func(q querier) error { return s.insert(ctx, q, envs) })
	}
	if err != nil {
		return s.wrap(ctx, "enqueue", duplicate(err))
	}
	s.NotifyCommitted(envs...)
	return nil
}

// inTx runs fn in a transaction of the store's own client.
func (s *Store) inTx(ctx context.Context, fn func(q querier) error) error {
	if s.pool != nil {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return fn(pgxQuerier{tx}) })
	}
	tx, err := s.sqlDB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(sqlQuerier{tx}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// insert writes envs (already checked) on q, in as few statements as the
// bind-parameter limit allows, and assigns their Seq.
func (s *Store) insert(ctx context.Context, q querier, envs []*driver.Envelope) error {
	if len(envs) == 0 {
		return nil
	}
	if err := s.verifyBuckets(ctx, q); err != nil {
		return err
	}
	limit := maxRows(s.dialect)
	for len(envs) > 0 {
		n := min(len(envs), limit)
		if err := s.insertChunk(ctx, q, envs[:n]); err != nil {
			return err
		}
		envs = envs[n:]
	}
	return nil
}

// insertStatement renders the multi-row INSERT for envs (RETURNING id, seq except
// on MySQL) and its arguments. Envelopes fresh from NewEnvelope (no attempt, no
// error, pending) leave the delivery-state columns to their defaults: fewer
// parameters to send and parse, as most writes are of that kind.
func (s *Store) insertStatement(envs []*driver.Envelope) (string, []any) {
	width := freshColumnCount
	for _, env := range envs {
		if env.Attempts != 0 || !env.NextAttemptAt.IsZero() || env.Status != driver.Pending || env.LastError != "" {
			width = insertColumnCount
			break
		}
	}
	args := make([]any, 0, len(envs)*width)
	for _, env := range envs {
		var part int64
		if env.Partition != nil {
			part = int64(*env.Partition)
		}
		var id any = idArg(s.dialect, env.ID)
		if s.pool != nil {
			id = [16]byte(env.ID) // binary on pgx: nothing to parse
		}
		args = append(args,
			id, env.Bucket, env.BucketCount, env.Topic,
			nonNil(env.Key), nonNil(env.Payload), driver.EncodeHeaders(env.Headers),
			part, messageFlags(&env.Message), micros(env.CreatedAt))
		if width == insertColumnCount {
			args = append(args, env.Attempts, micros(env.NextAttemptAt), int(env.Status))
		}
		args = append(args, truncateError(env.LastError))
	}
	var b strings.Builder
	b.Grow(64 + len(envs)*width*6)
	b.WriteString("INSERT INTO ")
	b.WriteString(s.cfg.Table)
	if width == insertColumnCount {
		b.WriteString(" (" + insertColumns + ") VALUES ")
	} else {
		b.WriteString(" (" + freshColumns + ") VALUES ")
	}
	placeholders(&b, s.dialect, len(envs), width, 0)
	if s.dialect != MySQL {
		b.WriteString(" RETURNING id, seq")
	}
	return b.String(), args
}

func (s *Store) insertChunk(ctx context.Context, q querier, envs []*driver.Envelope) error {
	query, args := s.insertStatement(envs)
	if s.dialect == MySQL {
		// MySQL has no RETURNING: LAST_INSERT_ID is the first row's seq and a
		// multi-row INSERT takes consecutive values (auto_increment_increment = 1).
		sq, ok := q.(sqlQuerier)
		if !ok {
			return errors.New("mysql needs a database/sql connection")
		}
		res, err := s.prepared.exec(ctx, s.sqlDB, sq.c, query, len(envs), args)
		if err != nil {
			return err
		}
		first, err := res.LastInsertId()
		if err != nil {
			return err
		}
		for i, env := range envs {
			env.Seq = first + int64(i)
		}
		return nil
	}
	rs, err := q.query(ctx, query, args...)
	if err != nil {
		return err
	}
	return assignSeqs(rs, envs)
}

// assignSeqs reads "RETURNING id, seq" rows into envs and closes rs.
func assignSeqs(rs rows, envs []*driver.Envelope) error {
	defer rs.Close()
	// Rows may come back in any order: match them by id (an id may repeat).
	byID := make(map[uuid.UUID][]*driver.Envelope, len(envs))
	for _, env := range envs {
		byID[env.ID] = append(byID[env.ID], env)
	}
	for rs.Next() {
		var id uuidValue
		var seq int64
		if err := rs.Scan(&id, &seq); err != nil {
			return err
		}
		if pending := byID[id.id]; len(pending) > 0 {
			pending[0].Seq = seq
			byID[id.id] = pending[1:]
		}
	}
	return rs.Err()
}

// duplicate marks a unique-key violation on the message id as invalid input: an
// envelope is written once.
func duplicate(err error) error {
	var state interface{ SQLState() string }
	dup := errors.As(err, &state) && state.SQLState() == "23505"
	msg := err.Error()
	dup = dup || strings.Contains(msg, "Error 1062") || strings.Contains(msg, "UNIQUE constraint failed")
	if dup {
		return fmt.Errorf("%w: an envelope with this ID is already stored: %w", outbox.ErrInvalidMessage, err)
	}
	return err
}

// NotifyCommitted wakes dispatchers for the envelopes' buckets: this process's at
// once and, on PostgreSQL, other processes' through NOTIFY, sent shortly after by a
// background sender that coalesces concurrent commits. Units of work and Enqueue
// call it after their commit; call it yourself, with what the EnqueueTx method
// returned, after committing a transaction you passed to it. Never call it before
// the commit: a dispatcher woken early finds nothing and waits for its next poll.
func (s *Store) NotifyCommitted(envs ...*driver.Envelope) {
	var buckets []int
	switch len(envs) {
	case 0:
		return
	case 1:
		buckets = []int{envs[0].Bucket}
	default:
		seen := make(map[int]struct{}, len(envs))
		buckets = make([]int, 0, len(envs))
		for _, env := range envs {
			if _, ok := seen[env.Bucket]; !ok {
				seen[env.Bucket] = struct{}{}
				buckets = append(buckets, env.Bucket)
			}
		}
	}
	s.hub.Notify(buckets...)
	if s.dialect == PostgreSQL && !s.cfg.DisableNotify {
		s.sender.queue(s, buckets)
	}
}

// Fetch implements [driver.Queue]: one index range scan on (status, bucket, seq).
//
// The scan always starts at the bucket's beginning. Starting where the previous
// fetch left off would skip the index entries of completed rows faster, but a
// transaction that took its Seq early and committed late would land behind that
// point, and a later message of its key could overtake it.
//
// A SQL store never cuts a batch: More is set when the batch filled its limit.
func (s driverStore) Fetch(ctx context.Context, bucket, limit int) (driver.Batch, error) {
	if err := s.begin(ctx); err != nil {
		return driver.Batch{}, err
	}
	if bucket < 0 || bucket >= s.cfg.BucketCount {
		return driver.Batch{}, fmt.Errorf("%w: sqlstore: bucket %d outside 0..%d", outbox.ErrMisconfigured, bucket, s.cfg.BucketCount-1)
	}
	if limit <= 0 {
		return driver.Batch{}, nil
	}
	if s.sqlDB != nil {
		s.idle.look(s.Store, s.sqlDB)
	}
	rs, err := s.db.query(ctx, s.stmts.fetch, bucket, limit)
	if err != nil {
		return driver.Batch{}, s.wrap(ctx, "fetch", err)
	}
	envs, err := scanEnvelopes(rs)
	if err != nil {
		return driver.Batch{}, s.wrap(ctx, "fetch", err)
	}
	return driver.Batch{Envelopes: envs, More: len(envs) >= limit}, nil
}

// Complete implements [driver.Queue]: one DELETE per batch.
func (s driverStore) Complete(ctx context.Context, envs []*driver.Envelope) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if len(envs) == 0 {
		return nil
	}
	if err := s.byEnvelopeID(ctx, "DELETE FROM "+s.cfg.Table+" WHERE", nil, envs); err != nil {
		return s.wrap(ctx, "complete", err)
	}
	s.vacuum.count(s.Store, len(envs))
	return nil
}

// MarkDispatched implements [driver.Retainer]: one UPDATE per batch.
func (s driverStore) MarkDispatched(ctx context.Context, envs []*driver.Envelope, at time.Time) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	if len(envs) == 0 {
		return nil
	}
	prefix := "UPDATE " + s.cfg.Table + " SET status = 2, dispatched_at = ? WHERE status = 0 AND"
	if s.dialect == PostgreSQL {
		prefix = rebind(prefix)
	}
	return s.wrap(ctx, "mark dispatched", s.byEnvelopeID(ctx, prefix, []any{micros(at)}, envs))
}

// byEnvelopeID runs "prefix id = ANY($n)" on PostgreSQL, "prefix id IN (...)"
// elsewhere, for every envelope's id.
func (s *Store) byEnvelopeID(ctx context.Context, prefix string, lead []any, envs []*driver.Envelope) error {
	// One statement text for every batch size, so the driver prepares it once per
	// connection: a text per size would cost a prepare round trip for each new size
	// and fill the driver's statement cache.
	if s.pool != nil {
		ids := make([]string, len(envs))
		for i, env := range envs {
			ids[i] = env.ID.String()
		}
		_, err := s.db.exec(ctx, prefix+fmt.Sprintf(" id = ANY($%d::uuid[])", len(lead)+1), append(lead, ids)...)
		return err
	}
	if s.dialect == PostgreSQL {
		// database/sql drivers bind no arrays: the ids travel as one array literal
		// ("{id,id}"), bound as text, which every driver does.
		_, err := s.db.exec(ctx, prefix+fmt.Sprintf(" id = ANY(CAST($%d AS text)::uuid[])", len(lead)+1), append(lead, uuidArray(envs))...)
		return err
	}
	const chunk = 5000
	for len(envs) > 0 {
		n := min(len(envs), chunk)
		var b strings.Builder
		b.WriteString(prefix)
		b.WriteString(" id IN ")
		inList(&b, s.dialect, n, len(lead))
		args := make([]any, 0, len(lead)+n)
		args = append(args, lead...)
		for _, env := range envs[:n] {
			args = append(args, idArg(s.dialect, env.ID))
		}
		if _, err := s.db.exec(ctx, b.String(), args...); err != nil {
			return err
		}
		envs = envs[n:]
	}
	return nil
}

// uuidArray renders the envelopes' ids as a PostgreSQL array literal.
func uuidArray(envs []*driver.Envelope) string {
	var b strings.Builder
	b.Grow(2 + len(envs)*37)
	b.WriteByte('{')
	for i, env := range envs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(env.ID.String())
	}
	b.WriteByte('}')
	return b.String()
}

// DeleteDispatched implements [driver.Retainer]. Each call deletes at most limit
// rows in one short statement, so cleanup never holds locks on the table for long.
func (s driverStore) DeleteDispatched(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	if limit <= 0 {
		return 0, nil
	}
	n, err := s.db.exec(ctx, s.stmts.deleteDispatched, micros(before), limit)
	if err != nil {
		return 0, s.wrap(ctx, "delete dispatched", err)
	}
	s.vacuum.count(s.Store, int(n))
	return int(n), nil
}

// Reschedule implements [driver.Queue]. A message that is no longer pending
// (completed, parked or purged meanwhile) is left alone.
func (s driverStore) Reschedule(ctx context.Context, env *driver.Envelope, next time.Time, cause string) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	_, err := s.db.exec(ctx, s.stmts.reschedule, micros(next), truncateError(cause), idArg(s.dialect, env.ID))
	return s.wrap(ctx, "reschedule", err)
}

// Park implements [driver.Queue].
func (s driverStore) Park(ctx context.Context, env *driver.Envelope, cause string) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	_, err := s.db.exec(ctx, s.stmts.park, truncateError(cause), idArg(s.dialect, env.ID))
	return s.wrap(ctx, "park", err)
}

// Find implements [driver.Finder].
func (s driverStore) Find(ctx context.Context, id uuid.UUID) (*driver.Envelope, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	rs, err := s.db.query(ctx, s.stmts.find, idArg(s.dialect, id))
	if err != nil {
		return nil, s.wrap(ctx, "find", err)
	}
	envs, err := scanEnvelopes(rs)
	if err != nil {
		return nil, s.wrap(ctx, "find", err)
	}
	if len(envs) == 0 {
		return nil, fmt.Errorf("%w: sqlstore: message %s", driver.ErrNotFound, id)
	}
	return envs[0], nil
}

// List implements [driver.Admin].
func (s driverStore) List(ctx context.Context, status driver.Status, after driver.Cursor, limit int) ([]*driver.Envelope, error) {
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	if limit <= 0 {
		return nil, nil
	}
	rs, err := s.db.query(ctx, s.stmts.list, int(status), after.Bucket, after.Bucket, after.Seq, limit)
	if err != nil {
		return nil, s.wrap(ctx, "list", err)
	}
	envs, err := scanEnvelopes(rs)
	return envs, s.wrap(ctx, "list", err)
}

// Requeue implements [driver.Admin].
func (s driverStore) Requeue(ctx context.Context, ids ...uuid.UUID) (int, error) {
	n, err := s.byID(ctx, "requeue", "UPDATE "+s.cfg.Table+" SET status = 0, attempts = 0, next_attempt_at = 0 WHERE status = 1 AND id IN ", ids)
	if err == nil && n > 0 {
		all := make([]int, s.cfg.BucketCount)
		for i := range all {
			all[i] = i
		}
		s.hub.Notify(all...)
	}
	return n, err
}

// Purge implements [driver.Admin].
func (s driverStore) Purge(ctx context.Context, ids ...uuid.UUID) (int, error) {
	return s.byID(ctx, "purge", "DELETE FROM "+s.cfg.Table+" WHERE id IN ", ids)
}

func (s *Store) byID(ctx context.Context, op, prefix string, ids []uuid.UUID) (int, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	total := 0
	const chunk = 5000
	for len(ids) > 0 {
		n := min(len(ids), chunk)
		var b strings.Builder
		b.WriteString(prefix)
		inList(&b, s.dialect, n, 0)
		args := make([]any, n)
		for i, id := range ids[:n] {
			args[i] = idArg(s.dialect, id)
		}
		affected, err := s.db.exec(ctx, b.String(), args...)
		if err != nil {
			return total, s.wrap(ctx, op, err)
		}
		total += int(affected)
		ids = ids[n:]
	}
	return total, nil
}

// Stats implements [driver.Admin]: per bucket a capped count and the head's age,
// each an index range scan. On PostgreSQL it adds the lag of the log mode's slot
// (Config.Slot, or its default in TableMode) when the slot exists.
func (s driverStore) Stats(ctx context.Context) (driver.Backlog, error) {
	if err := s.begin(ctx); err != nil {
		return driver.Backlog{}, err
	}
	st := driver.Backlog{Pending: make([]int, s.cfg.BucketCount), PendingLimit: s.cfg.StatsLimit}
	scanOne := func(query string, args ...any) (int64, bool, error) {
		rs, err := s.db.query(ctx, query, args...)
		if err != nil {
			return 0, false, err
		}
		defer rs.Close()
		var v int64
		found := rs.Next()
		if found {
			if err := rs.Scan(&v); err != nil {
				return 0, false, err
			}
		}
		return v, found, rs.Err()
	}
	for b := range s.cfg.BucketCount {
		n, _, err := scanOne(s.stmts.statsPending, b, s.cfg.StatsLimit)
		if err != nil {
			return st, s.wrap(ctx, "stats", err)
		}
		st.Pending[b] = int(n)
		if n == 0 {
			continue
		}
		created, ok, err := scanOne(s.stmts.statsHead, b)
		if err != nil {
			return st, s.wrap(ctx, "stats", err)
		}
		if t := fromMicros(created); ok && !t.IsZero() && (st.OldestPending.IsZero() || t.Before(st.OldestPending)) {
			st.OldestPending = t
		}
	}
	parked, _, err := scanOne(s.stmts.statsParked, s.cfg.StatsLimit)
	if err != nil {
		return st, s.wrap(ctx, "stats", err)
	}
	st.Parked = int(parked)
	if s.dialect == PostgreSQL {
		// A slot left by the log mode keeps WAL in table mode too: show it.
		lag, err := s.streamLag(ctx)
		if err != nil {
			return st, s.wrap(ctx, "stats", err)
		}
		st.Stream = lag
	}
	return st, nil
}

// Config returns the store's configuration with every default filled in.
func (s *Store) Config() Config { return s.cfg }
