package chaostest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/transport/kafkatransport"
)

// What the log mode's chaos runs share: a store in the log mode on a PostgreSQL
// cluster of the test's own with wal_level=logical, a Kafka cluster (kfake), writers
// committing keyed units throughout, and the checks every run ends with (nothing
// lost, first deliveries of every key in commit order, the slot never ahead of what
// was acknowledged).

const logTopic = "orders"

// logRig is one run's PostgreSQL cluster, log-mode store and Kafka cluster.
type logRig struct {
	cluster *pgcluster.Cluster
	pool    *pgxpool.Pool
	store   *sqlstore.Store
	kafka   *kfake.Cluster
	// audit is a second slot on the same publication, created before anything is
	// written and never read until the run is over: it keeps every message with the
	// position of its transaction's commit, which the Kafka records do not carry.
	audit string
}

func newLogRig(t *testing.T) *logRig {
	t.Helper()
	c := pgcluster.Start(t, pgcluster.Logical)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, c.URL("postgres")+"&pool_max_conns=8")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := sqlstore.NewPgx(pool, sqlstore.Config{
		Table: uniqueTable("lc"), BucketCount: killBuckets, Mode: sqlstore.LogMode, Logger: slog.New(slog.DiscardHandler),
	})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	t.Cleanup(func() { _ = store.Close() })
	audit := store.Config().Slot + "_audit"
	_, err = pool.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", audit)
	require.NoError(t, err)

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(killBuckets, logTopic))
	require.NoError(t, err)
	t.Cleanup(kc.Close)
	return &logRig{cluster: c, pool: pool, store: store, kafka: kc, audit: audit}
}

// handle opens another store on the same tables and slot through a pool of its own,
// as a relay in another process would.
func (r *logRig) handle(t *testing.T) *sqlstore.Store {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), r.cluster.URL("postgres")+"&pool_max_conns=6")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := r.store.Config()
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := sqlstore.NewPgx(pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// kafkaTransport is a Kafka transport on a client of its own; with dial, the client
// reaches every broker through it (a fault proxy).
func (r *logRig) kafkaTransport(t *testing.T, dial func(ctx context.Context, network, host string) (net.Conn, error)) driver.Transport {
	t.Helper()
	opts := []kgo.Opt{kgo.SeedBrokers(r.kafka.ListenAddrs()...), kgo.ProducerLinger(0)}
	if dial != nil {
		opts = append(opts, kgo.Dialer(dial))
	}
	client, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	t.Cleanup(client.Close)
	tr, err := kafkatransport.New(client, kafkatransport.Config{AckTimeout: time.Second})
	require.NoError(t, err)
	return tr
}

// streamLease reads the stream reader's lease from the lease table: its owner and
// when it lapses (zero when no relay ever took it).
func (r *logRig) streamLease(ctx context.Context) (string, time.Time, error) {
	var owner string
	var exp int64
	err := r.pool.QueryRow(ctx, "SELECT owner, expires_at FROM "+r.store.Config().LeaseTable+" WHERE bucket = $1", driver.StreamLease).Scan(&owner, &exp)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, err
	}
	return owner, time.UnixMicro(exp), nil
}

// slotReader is the process id of the server's WAL sender that has the store's slot
// open, 0 when no reader has.
func (r *logRig) slotReader(ctx context.Context) (int32, error) {
	var pid int32
	err := r.pool.QueryRow(ctx, "SELECT COALESCE(active_pid, 0) FROM pg_replication_slots WHERE slot_name = $1", r.store.Config().Slot).Scan(&pid)
	return pid, err
}

// parked lists the parked envelopes through Admin.
func (r *logRig) parked(t *testing.T) []*driver.Envelope {
	t.Helper()
	admin := r.store.Driver().(driver.Admin)
	var out []*driver.Envelope
	var after driver.Cursor
	for {
		envs, err := admin.List(context.Background(), driver.Parked, after, 500)
		require.NoError(t, err)
		out = append(out, envs...)
		if len(envs) < 500 {
			return out
		}
		after = driver.After(envs[len(envs)-1])
	}
}

func (r *logRig) rows(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, r.pool.QueryRow(context.Background(), "SELECT COUNT(*) FROM "+r.store.Config().Table).Scan(&n))
	return n
}

// logMsg is one message the writers sent: its key and its number within the key.
type logMsg struct {
	key string
	seq int
}

// logLedger is what the writers committed and rolled back.
type logLedger struct {
	mu         sync.Mutex
	committed  map[uuid.UUID]logMsg
	byKey      map[string][]uuid.UUID // committed, in commit order
	rolledBack map[uuid.UUID]bool
	err        error
}

// write starts writers committing units of one to four messages of keys (a tenth
// rolled back) until the returned stop is called, which returns what they did. Each
// key has one writer, so its commit order is the order that writer committed.
func (r *logRig) write(t *testing.T, keys []string, writers int, pause time.Duration) (stop func() *logLedger) {
	t.Helper()
	l := &logLedger{committed: map[uuid.UUID]logMsg{}, byKey: map[string][]uuid.UUID{}, rolledBack: map[uuid.UUID]bool{}}
	sender, err := outbox.NewSender(r.store, outbox.SenderConfig{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range writers {
		var mine []string
		for i, k := range keys {
			if i%writers == w {
				mine = append(mine, k)
			}
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			seq := map[string]int{}
			for ctx.Err() == nil {
				n := 1 + rng.IntN(4)
				ids := make([]uuid.UUID, n)
				msgs := make([]logMsg, n)
				for i := range n {
					k := mine[rng.IntN(len(mine))]
					seq[k]++
					ids[i], msgs[i] = uuid.New(), logMsg{k, seq[k]}
				}
				rollback := rng.IntN(10) == 0
				err := r.store.Transact(context.WithoutCancel(ctx), func(ctx context.Context) error {
					for i, m := range msgs {
						err := sender.Send(ctx, outbox.Message{ID: ids[i], Topic: logTopic, Key: []byte(m.key), Payload: fmt.Appendf(nil, "%s:%d", m.key, m.seq)})
						if err != nil {
							return err
						}
					}
					if rollback {
						return errRolledBack
					}
					return nil
				})
				l.mu.Lock()
				switch {
				case err == nil:
					for i, m := range msgs {
						l.committed[ids[i]] = m
						l.byKey[m.key] = append(l.byKey[m.key], ids[i])
					}
				case errors.Is(err, errRolledBack):
					for _, id := range ids {
						l.rolledBack[id] = true
					}
				default:
					l.err = errors.Join(l.err, err)
				}
				l.mu.Unlock()
				if err != nil && !errors.Is(err, errRolledBack) {
					return
				}
				time.Sleep(pause)
			}
		})
	}
	return func() *logLedger {
		cancel()
		wg.Wait()
		require.NoError(t, l.err, "a unit of work failed")
		require.NotEmpty(t, l.committed)
		return l
	}
}

// slotSample is what the sampler saw, read in this order: the slot's confirmed
// position, then the IDs in the messages table, then Kafka's end offsets.
type slotSample struct {
	confirmed pglogrepl.LSN
	table     map[uuid.UUID]bool
	ends      map[int32]int64
}

// slotSampler samples the slot every interval, keeping the samples in which the
// confirmed position moved.
type slotSampler struct {
	r       *logRig
	admin   *kadm.Client
	mu      sync.Mutex
	samples []slotSample
	taken   int // samples read, moved or not
	failed  []error
	stop    context.CancelFunc
	done    chan struct{}
}

func (r *logRig) sampleSlot(t *testing.T, every time.Duration) *slotSampler {
	t.Helper()
	client, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(client.Close)
	ctx, cancel := context.WithCancel(context.Background())
	s := &slotSampler{r: r, admin: kadm.NewClient(client), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			err := s.sample(ctx)
			s.mu.Lock()
			s.taken++
			if err != nil && ctx.Err() == nil {
				s.failed = append(s.failed, err)
			}
			s.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(s.halt)
	return s
}

// sample takes one sample; it keeps it only if the confirmed position moved.
func (s *slotSampler) sample(ctx context.Context) error {
	var lsn string
	err := s.r.pool.QueryRow(ctx, "SELECT COALESCE(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1", s.r.store.Config().Slot).Scan(&lsn)
	if err != nil {
		return err
	}
	confirmed, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return err
	}
	s.mu.Lock()
	moved := len(s.samples) == 0 || confirmed > s.samples[len(s.samples)-1].confirmed
	s.mu.Unlock()
	if !moved {
		return nil
	}
	smp := slotSample{confirmed: confirmed, table: map[uuid.UUID]bool{}, ends: map[int32]int64{}}
	rows, err := s.r.pool.Query(ctx, "SELECT id FROM "+s.r.store.Config().Table)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		smp.table[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	offs, err := s.admin.ListEndOffsets(ctx, logTopic)
	if err != nil {
		return err
	}
	offs.Each(func(o kadm.ListedOffset) {
		if o.Err == nil {
			smp.ends[o.Partition] = o.Offset
		}
	})
	if len(smp.ends) != killBuckets {
		return fmt.Errorf("end offsets of %d partitions of %d", len(smp.ends), killBuckets)
	}
	s.mu.Lock()
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
	return nil
}

func (s *slotSampler) halt() {
	s.stop()
	<-s.done
}

// finish waits until the slot's confirmed position passed every committed message
// (the reader confirms what it settled), takes a last sample and stops sampling.
func (s *slotSampler) finish(t *testing.T, commits map[uuid.UUID]pglogrepl.LSN, within time.Duration) []slotSample {
	t.Helper()
	var last pglogrepl.LSN
	for _, c := range commits {
		last = max(last, c)
	}
	require.Eventually(t, func() bool {
		_ = s.sample(context.Background())
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.samples) > 0 && s.samples[len(s.samples)-1].confirmed > last
	}, within, 20*time.Millisecond, "the slot's confirmed position never passed the last commit")
	s.halt()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("slot sampler: %d samples read, the confirmed position moved in %d, %d failed %v", s.taken, len(s.samples), len(s.failed), s.failed[:min(len(s.failed), 3)])
	return slices.Clone(s.samples)
}

// commits reads the audit slot: every message of the store's prefix, with the
// position of its transaction's commit record. A confirmed position past a commit
// record's start is one the server no longer sends that transaction from.
func (r *logRig) commits(t *testing.T) map[uuid.UUID]pglogrepl.LSN {
	t.Helper()
	rows, err := r.pool.Query(context.Background(),
		"SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2, 'messages', 'true')",
		r.audit, r.store.Config().Publication)
	require.NoError(t, err)
	defer rows.Close()
	out := map[uuid.UUID]pglogrepl.LSN{}
	var open []uuid.UUID
	for rows.Next() {
		var data []byte
		require.NoError(t, rows.Scan(&data))
		msg, err := pglogrepl.Parse(data)
		require.NoError(t, err)
		switch m := msg.(type) {
		case *pglogrepl.BeginMessage:
			open = nil
		case *pglogrepl.LogicalDecodingMessage:
			if m.Transactional && m.Prefix == r.store.LogPrefix() {
				envs, err := sqlstore.DecodeLogMessage(m.Content)
				require.NoError(t, err)
				for _, e := range envs {
					open = append(open, e.ID)
				}
			}
		case *pglogrepl.CommitMessage:
			for _, id := range open {
				out[id] = m.CommitLSN
			}
			open = nil
		}
	}
	require.NoError(t, rows.Err())
	return out
}

// delivery is where a message's first copy landed in Kafka.
type delivery struct {
	partition int32
	offset    int64
}

// readKafka consumes the topic from its start until every message of want was seen,
// for at most within, and returns the first copy of each message it saw and how many
// copies it read in all. A record of a message never committed fails the test.
func (r *logRig) readKafka(t *testing.T, l *logLedger, want func(uuid.UUID) bool, within time.Duration) (map[uuid.UUID]delivery, int) {
	t.Helper()
	consumer, err := kgo.NewClient(kgo.SeedBrokers(r.kafka.ListenAddrs()...), kgo.ConsumeTopics(logTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer consumer.Close()
	wanted := 0
	for id := range l.committed {
		if want(id) {
			wanted++
		}
	}
	first := map[uuid.UUID]delivery{}
	seen, copies := 0, 0
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for seen < wanted && ctx.Err() == nil {
		consumer.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			d, err := kafkatransport.Decode(rec)
			require.NoError(t, err)
			copies++
			require.False(t, l.rolledBack[d.ID], "a rolled-back message was delivered: %s", d.Payload)
			_, ok := l.committed[d.ID]
			require.True(t, ok, "a message never committed was delivered: %s", d.Payload)
			if _, dup := first[d.ID]; dup {
				return
			}
			first[d.ID] = delivery{partition: rec.Partition, offset: rec.Offset}
			if want(d.ID) {
				seen++
			}
		})
	}
	return first, copies
}

// requireDelivered checks that every committed message of want reached Kafka and that
// each key's first deliveries are in commit order.
func requireDelivered(t *testing.T, l *logLedger, first map[uuid.UUID]delivery, want func(uuid.UUID) bool) {
	t.Helper()
	missing, outOfOrder := 0, 0
	var examples []string
	for key, ids := range l.byKey {
		prev := delivery{offset: -1}
		for _, id := range ids {
			if !want(id) {
				continue
			}
			d, ok := first[id]
			if !ok {
				missing++
				continue
			}
			if prev.offset >= 0 && (d.partition != prev.partition || d.offset < prev.offset) {
				outOfOrder++
				if len(examples) < 5 {
					examples = append(examples, fmt.Sprintf("%s#%d at %d/%d, before the one committed before it at %d/%d",
						key, l.committed[id].seq, d.partition, d.offset, prev.partition, prev.offset))
				}
			}
			prev = d
		}
	}
	require.Zero(t, missing, "committed messages missing from Kafka")
	require.Zero(t, outOfOrder, "first deliveries out of commit order: %s", strings.Join(examples, "; "))
}

// requireSlotBehindAcks is the check that the slot's confirmed position never passed
// a message that was not settled. The envelopes the relay publishes do not carry
// their position in the log, so it is taken from the broker and the table
// themselves: each sample read the confirmed position first, then the IDs in the
// messages table, then Kafka's end offsets. A message whose commit record lies before
// the confirmed position is one the server will never send again; the relay may have
// confirmed that position only after the broker acknowledged the message (so its first
// copy sits below the end offset read after it: Kafka's end offset moves when a record
// is written, before the producer hears of it) or after it wrote the message into the
// table (so the table still holds it, or the table lane published it, and deleted it,
// before the table was read). A relay that confirmed a batch before every message of
// it was settled — before the publish returned, or past a publish that failed — fails
// the check whenever a sample falls between the early confirmation and the
// acknowledgement, or for good when the message is never delivered.
func requireSlotBehindAcks(t *testing.T, samples []slotSample, commits map[uuid.UUID]pglogrepl.LSN, first map[uuid.UUID]delivery, l *logLedger) {
	t.Helper()
	for id := range l.committed {
		_, ok := commits[id]
		require.True(t, ok, "the audit slot lacks a committed message")
	}
	for id := range l.rolledBack {
		_, ok := commits[id]
		require.False(t, ok, "the audit slot holds a rolled-back message")
	}
	type positioned struct {
		id  uuid.UUID
		lsn pglogrepl.LSN
	}
	byLSN := make([]positioned, 0, len(l.committed))
	for id := range l.committed {
		byLSN = append(byLSN, positioned{id, commits[id]})
	}
	sort.Slice(byLSN, func(i, j int) bool { return byLSN[i].lsn < byLSN[j].lsn })
	checked, ahead := 0, 0
	var examples []string
	for _, s := range samples {
		for _, p := range byLSN {
			if p.lsn >= s.confirmed {
				break
			}
			checked++
			if s.table[p.id] {
				continue
			}
			if d, ok := first[p.id]; ok && d.offset < s.ends[d.partition] {
				continue
			}
			ahead++
			if len(examples) < 5 {
				m := l.committed[p.id]
				examples = append(examples, fmt.Sprintf("%s#%d (commit at %s) behind the confirmed %s", m.key, m.seq, p.lsn, s.confirmed))
			}
		}
	}
	t.Logf("slot check: %d samples, %d message positions checked against them", len(samples), checked)
	require.Positive(t, checked, "no sample passed a message: the check checked nothing")
	require.Zero(t, ahead, "the slot was confirmed past messages neither acknowledged nor in the table: %s", strings.Join(examples, "; "))
}

// testLogger is a relay's WARN and ERROR log, printed if the test fails.
func testLogger(t *testing.T, name string) *slog.Logger {
	w := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log:\n%s", name, w.String())
		}
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logKeys names n keys.
func logKeys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("key-%02d", i)
	}
	return out
}
