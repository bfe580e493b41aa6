package tests

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// The benchmarks run on PostgreSQL through pgx (OUTBOX_TEST_POSTGRES_URL).

func pgxBackend() backend { return backends[0] }

func randomPayload(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// BenchmarkEnqueueOverhead measures what the outbox adds to a one-row business
// transaction that also sends 0, 1 or 10 messages, beside the same transaction
// writing the messages into a plain table (BIGSERIAL id, topic, key, payload): the
// least a hand-written outbox pays. Every iteration runs the business transaction
// alone, the plain-table one and the outbox one, so all three see the same server
// state. path=transact sends inside Transact; path=tx is the application's own pgx
// transaction with EnqueuePgxTx and, after the commit, NotifyCommitted, as the SQL
// store's page documents. "x-plain" is the outbox transaction's cost as a multiple
// of the business transaction alone, "raw-x-plain" the plain-table one's.
func BenchmarkEnqueueOverhead(b *testing.B) {
	for _, path := range []string{"transact", "tx"} {
		for _, writers := range []int{1, 8} {
			for _, staged := range []int{0, 1, 10} {
				b.Run(fmt.Sprintf("path=%s/writers=%d/staged=%d", path, writers, staged), func(b *testing.B) {
					benchEnqueueOverhead(b, path, writers, staged)
				})
			}
		}
	}
}

func benchEnqueueOverhead(b *testing.B, path string, writers, staged int) {
	ctx := context.Background()
	s := pgxBackend().open(b, sqlstore.Config{})
	pool := postgresPool(b)
	orders, raw := uniqueTable()+"_orders", uniqueTable()+"_raw"
	for _, ddl := range []string{
		"CREATE TABLE " + orders + " (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL, total BIGINT NOT NULL)",
		"CREATE TABLE " + raw + " (id BIGSERIAL PRIMARY KEY, topic TEXT NOT NULL, msg_key BYTEA NOT NULL, payload BYTEA NOT NULL)",
	} {
		_, err := pool.Exec(ctx, ddl)
		require.NoError(b, err)
	}
	b.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+orders+", "+raw) })
	insert := "INSERT INTO " + orders + " (customer, total) VALUES ($1, $2)"
	rawInsert := "INSERT INTO " + raw + " (topic, msg_key, payload) SELECT 'orders', k, p FROM unnest($1::bytea[], $2::bytea[]) AS m(k, p)"
	payload := randomPayload(1024)
	sender := capture(b, s, outbox.Transactional)
	keys := func(i int64) [][]byte {
		out := make([][]byte, staged)
		for j := range out {
			out[j] = fmt.Appendf(nil, "order-%d", (int(i)*staged+j)%100)
		}
		return out
	}
	send := func(ctx context.Context, i int64) error {
		for _, k := range keys(i) {
			if err := sender.Send(ctx, outbox.Message{Topic: "orders", Key: k, Payload: payload}); err != nil {
				return err
			}
		}
		return nil
	}
	var outboxTx func(i int64) error
	switch path {
	case "transact":
		outboxTx = func(i int64) error {
			return s.Transact(ctx, func(ctx context.Context) error {
				tx, _ := sqlstore.PgxTx(ctx)
				if _, err := tx.Exec(ctx, insert, "customer", i); err != nil {
					return err
				}
				return send(ctx, i)
			})
		}
	case "tx":
		outboxTx = func(i int64) error {
			ctx, scope := outbox.NewScope(ctx)
			defer scope.Release()
			var written []*driver.Envelope
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insert, "customer", i); err != nil {
					return err
				}
				if err := send(ctx, i); err != nil {
					return err
				}
				var err error
				written, err = s.EnqueuePgxTx(ctx, tx)
				return err
			})
			if err == nil {
				s.NotifyCommitted(written...)
			}
			return err
		}
	}

	// Count the wake-ups other processes hear: commits made close together share one.
	var notified atomic.Int64
	listenConn, err := pgx.Connect(ctx, postgresURL())
	require.NoError(b, err)
	_, err = listenConn.Exec(ctx, `LISTEN "`+s.Config().NotifyChannel+`"`)
	require.NoError(b, err)
	listenCtx, stopListening := context.WithCancel(ctx)
	listening := make(chan struct{})
	go func() {
		defer close(listening)
		for {
			if _, err := listenConn.WaitForNotification(listenCtx); err != nil {
				return
			}
			notified.Add(1)
		}
	}()
	defer func() {
		stopListening()
		<-listening
		_ = listenConn.Close(context.Background())
	}()

	var plainNs, rawNs, outboxNs, n, seq atomic.Int64
	work := func() error {
		i := seq.Add(1)
		start := time.Now()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, insert, "customer", i)
			return err
		}); err != nil {
			return err
		}
		t1 := time.Now()
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, insert, "customer", i); err != nil {
				return err
			}
			if staged == 0 {
				return nil
			}
			payloads := make([][]byte, staged)
			for j := range payloads {
				payloads[j] = slices.Clone(payload) // each row sends its own, as the outbox's do
			}
			_, err := tx.Exec(ctx, rawInsert, keys(i), payloads)
			return err
		}); err != nil {
			return err
		}
		t2 := time.Now()
		err := outboxTx(i)
		end := time.Now()
		plainNs.Add(int64(t1.Sub(start)))
		rawNs.Add(int64(t2.Sub(t1)))
		outboxNs.Add(int64(end.Sub(t2)))
		n.Add(1)
		return err
	}
	b.ResetTimer()
	if writers == 1 {
		for b.Loop() {
			if err := work(); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.SetParallelism(max(1, writers/max(1, runtimeProcs())))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := work(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.StopTimer()
	if n.Load() > 0 {
		b.ReportMetric(float64(plainNs.Load())/float64(n.Load())/1e3, "plain-µs/tx")
		b.ReportMetric(float64(outboxNs.Load())/float64(n.Load())/1e3, "outbox-µs/tx")
		b.ReportMetric(float64(outboxNs.Load())/float64(plainNs.Load()), "x-plain")
		b.ReportMetric(float64(rawNs.Load())/float64(plainNs.Load()), "raw-x-plain")
		time.Sleep(10 * time.Millisecond) // the last wake-up is on its way
		b.ReportMetric(float64(notified.Load())/float64(n.Load()), "notify/tx")
	}
}

// fill writes n messages with distinct keys, in large multi-row inserts.
func fill(b *testing.B, ctx context.Context, s *sqlstore.Store, n int, payload []byte) {
	const chunk = 2000
	for done := 0; done < n; done += chunk {
		envs := make([]*driver.Envelope, 0, chunk)
		for i := done; i < min(n, done+chunk); i++ {
			env, err := driver.NewEnvelope(outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "order-%d", i), Payload: payload,
				Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(uuid.NewString())}}}, s.Config().BucketCount)
			require.NoError(b, err)
			envs = append(envs, env)
		}
		require.NoError(b, drv(s).Enqueue(ctx, envs...))
	}
	_, err := postgresPool(b).Exec(ctx, "VACUUM ANALYZE "+s.Config().Table)
	require.NoError(b, err)
}

// rawDrain is the baseline: a plain loop over the buckets that selects a batch of
// the bucket head in Seq order, hands it to the same recording transport and deletes
// it, with pgx on an identical table. No leases, no key bookkeeping, one connection.
func rawDrain(b *testing.B, ctx context.Context, table string, buckets, batch int, rec *outboxtest.Recorder) int {
	pool := postgresPool(b)
	sel := "SELECT " + sqlstoreColumns + " FROM " + table + " WHERE status = 0 AND bucket = $1 ORDER BY seq LIMIT $2"
	del := "DELETE FROM " + table + " WHERE id = ANY($1::uuid[])"
	total := 0
	for bucket := range buckets {
		for {
			rows, err := pool.Query(ctx, sel, bucket, batch)
			require.NoError(b, err)
			var envs []*driver.Envelope
			var ids []string
			for rows.Next() {
				env := &driver.Envelope{}
				var id string
				var bucket, count, part, flags, created, attempts, next, status, dispatched int64
				var headers []byte
				require.NoError(b, rows.Scan(&env.Seq, &id, &bucket, &count, &env.Topic, &env.Key, &env.Payload, &headers,
					&part, &flags, &created, &attempts, &next, &status, &env.LastError, &dispatched))
				env.ID = uuid.MustParse(id)
				envs = append(envs, env)
				ids = append(ids, id)
			}
			require.NoError(b, rows.Err())
			if len(envs) == 0 {
				break
			}
			require.NoError(b, rec.Publish(ctx, envs))
			_, err = pool.Exec(ctx, del, ids)
			require.NoError(b, err)
			total += len(envs)
		}
	}
	return total
}

const sqlstoreColumns = "seq, id, bucket, bucket_count, topic, msg_key, payload, headers, part, flags, created_at, attempts, next_attempt_at, status, last_error, dispatched_at"

// BenchmarkDrain measures how fast a relay empties a backlog into the recording
// transport, beside the raw loop in the same run: "msg/s" is the relay,
// "raw-msg/s" the baseline and "x-raw" their ratio. Set OUTBOX_BENCH_LARGE=1 to add
// the 200,000-message backlog (batch sizes 100 and 500).
func BenchmarkDrain(b *testing.B) {
	backlogs := []int{20_000}
	if os.Getenv("OUTBOX_BENCH_LARGE") != "" {
		backlogs = append(backlogs, 200_000)
	}
	for _, backlog := range backlogs {
		batches := []int{1, 100, 500}
		if backlog > 20_000 {
			batches = batches[1:] // one fsync per message: 200,000 of them take minutes
		}
		for _, batch := range batches {
			b.Run(fmt.Sprintf("backlog=%d/batch=%d", backlog, batch), func(b *testing.B) {
				ctx := context.Background()
				s := pgxBackend().open(b, sqlstore.Config{})
				raw := pgxBackend().open(b, sqlstore.Config{})
				payload := randomPayload(256)
				var relayTime, rawTime time.Duration
				var relayMsgs, rawMsgs int
				for b.Loop() {
					b.StopTimer()
					fill(b, ctx, s, backlog, payload)
					fill(b, ctx, raw, backlog, payload)
					rawRec := outboxtest.NewRecorder()
					start := time.Now()
					rawMsgs += rawDrain(b, ctx, raw.Config().Table, raw.Config().BucketCount, batch, rawRec)
					rawTime += time.Since(start)

					rec := outboxtest.NewRecorder()
					d, err := relay.New(s, rec, relay.Config{BucketCount: s.Config().BucketCount, BatchSize: batch, RelayID: "bench", Logger: quietLog})
					require.NoError(b, err)
					b.StartTimer()
					start = time.Now()
					res, err := d.RunOnce(ctx)
					relayTime += time.Since(start)
					require.NoError(b, err)
					require.Equal(b, backlog, res.Published)
					relayMsgs += res.Published
				}
				b.ReportMetric(float64(relayMsgs)/relayTime.Seconds(), "msg/s")
				b.ReportMetric(float64(rawMsgs)/rawTime.Seconds(), "raw-msg/s")
				b.ReportMetric((float64(relayMsgs)/relayTime.Seconds())/(float64(rawMsgs)/rawTime.Seconds()), "x-raw")
			})
		}
	}
}

// stampTransport notes when each message (by key) reached Publish.
type stampTransport struct {
	mu   sync.Mutex
	at   map[string]time.Time
	next driver.Transport
	seen chan struct{}
}

func (s *stampTransport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	now := time.Now()
	s.mu.Lock()
	for _, env := range batch {
		if _, ok := s.at[string(env.Key)]; !ok {
			s.at[string(env.Key)] = now
		}
	}
	s.mu.Unlock()
	select {
	case s.seen <- struct{}{}:
	default:
	}
	return s.next.Publish(ctx, batch)
}

// BenchmarkCommitToDispatchLatency commits one message per unit of work at a steady
// 300 messages/s while a worker with wake-ups on relays them; it reports the
// p50/p99 time from the commit returning to the message reaching the transport.
// The worker polls only once a second, so the wake-ups carry the latency: with
// relay=writer the writer's own store wakes it in process, with relay=peer the
// worker runs on a store of its own, as in another process, and the writer's
// NOTIFY wakes it through PostgreSQL.
func BenchmarkCommitToDispatchLatency(b *testing.B) {
	for _, relay := range []string{"writer", "peer"} {
		b.Run("relay="+relay, func(b *testing.B) { benchCommitToDispatch(b, relay == "peer") })
	}
}

func benchCommitToDispatch(b *testing.B, peer bool) {
	ctx := context.Background()
	s := pgxBackend().open(b, sqlstore.Config{})
	relayStore := s
	if peer {
		var err error
		relayStore, err = sqlstore.NewPgx(postgresPool(b), s.Config())
		require.NoError(b, err)
		b.Cleanup(func() { _ = relayStore.Close() })
	}
	st := &stampTransport{at: map[string]time.Time{}, next: outboxtest.NewRecorder(), seen: make(chan struct{}, 1)}
	d, err := relay.New(relayStore, st, relay.Config{BucketCount: s.Config().BucketCount, PollInterval: time.Second, Logger: quietLog})
	require.NoError(b, err)
	require.NoError(b, d.Start(ctx))
	defer func() { require.NoError(b, d.Stop(ctx)) }()
	require.Eventually(b, func() bool { return len(d.Owned()) == s.Config().BucketCount }, 10*time.Second, time.Millisecond)
	payload := randomPayload(256)

	sender := capture(b, s, outbox.Transactional)
	committed := map[string]time.Time{}
	tick := time.NewTicker(time.Second / 300)
	defer tick.Stop()
	i := 0
	b.ResetTimer()
	for b.Loop() {
		<-tick.C
		i++
		key := fmt.Sprintf("order-%d", i)
		require.NoError(b, s.Transact(ctx, func(ctx context.Context) error {
			return sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte(key), Payload: payload})
		}))
		committed[key] = time.Now()
	}
	b.StopTimer()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st.mu.Lock()
		n := len(st.at)
		st.mu.Unlock()
		if n >= len(committed) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	lat := make([]time.Duration, 0, len(committed))
	for key, c := range committed {
		p, ok := st.at[key]
		require.True(b, ok, "message %s never dispatched", key)
		lat = append(lat, max(0, p.Sub(c)))
	}
	slices.Sort(lat)
	pct := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1e3 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
