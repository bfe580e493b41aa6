package logtests

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// BenchmarkWriteCost measures what a unit of work that inserts one business row and
// sends 1 or 10 messages costs in each mode, as a multiple of the business
// transaction alone ("x-plain"), on pgx, one writer. Every iteration runs the three
// transactions (alone, table mode, log mode) back to back, so all see the same server.
func BenchmarkWriteCost(b *testing.B) {
	for _, staged := range []int{1, 10} {
		b.Run(fmt.Sprintf("staged=%d", staged), func(b *testing.B) {
			need(b)
			ctx := context.Background()
			table := uniqueTable()
			tableStore, err := sqlstore.NewPgx(pool, sqlstore.Config{Table: table, Logger: quietLog})
			require.NoError(b, err)
			require.NoError(b, tableStore.Migrate(ctx))
			b.Cleanup(func() { _ = tableStore.DropTables(context.Background()) })
			logStore := open(b, clients[0], sqlstore.Config{})
			orders := uniqueTable() + "_orders"
			_, err = pool.Exec(ctx, "CREATE TABLE "+orders+" (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, customer TEXT NOT NULL, total BIGINT NOT NULL)")
			require.NoError(b, err)
			b.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+orders) })
			// The slot keeps what is written; a reader confirms it as the relay would.
			st := openStream(b, logStore)
			drained := make(chan struct{})
			readCtx, stopReading := context.WithCancel(ctx)
			go func() {
				defer close(drained)
				for readCtx.Err() == nil {
					_, pos, err := st.Next(readCtx)
					if err != nil {
						return
					}
					if pos != 0 {
						_ = st.Confirm(readCtx, pos)
					}
				}
			}()
			defer func() { stopReading(); <-drained }()
			payload := make([]byte, 1024)
			insert := "INSERT INTO " + orders + " (customer, total) VALUES ($1, $2)"
			run := func(s *sqlstore.Store, snd outbox.Sender) time.Duration {
				start := time.Now()
				err := s.Transact(ctx, func(ctx context.Context) error {
					tx, _ := sqlstore.PgxTx(ctx)
					if _, err := tx.Exec(ctx, insert, "c", 1); err != nil {
						return err
					}
					for j := range staged {
						if snd == nil {
							continue
						}
						if err := snd.Send(ctx, outbox.Message{Topic: "orders", Key: fmt.Appendf(nil, "k%d", j), Payload: payload}); err != nil {
							return err
						}
					}
					return nil
				})
				require.NoError(b, err)
				return time.Since(start)
			}
			tableSnd, logSnd := sender(b, tableStore, outbox.Transactional), sender(b, logStore, outbox.Transactional)
			var alone, inTable, inLog []time.Duration
			b.ResetTimer()
			for b.Loop() {
				alone = append(alone, run(tableStore, nil))
				inTable = append(inTable, run(tableStore, tableSnd))
				inLog = append(inLog, run(logStore, logSnd))
			}
			b.StopTimer()
			med := func(d []time.Duration) float64 {
				sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
				return float64(d[len(d)/2])
			}
			b.ReportMetric(med(alone)/1e3, "us-alone")
			b.ReportMetric(med(inTable)/med(alone), "table-x-plain")
			b.ReportMetric(med(inLog)/med(alone), "log-x-plain")
		})
	}
}

// BenchmarkDrain measures how fast a relay publishes a backlog of 20,000 messages
// written while no relay ran (200 keys, units of 10), to an in-process recorder, in
// each mode.
func BenchmarkDrain(b *testing.B) {
	const backlog = 20_000
	for _, mode := range []sqlstore.Mode{sqlstore.TableMode, sqlstore.LogMode} {
		b.Run("mode="+mode.String(), func(b *testing.B) {
			need(b)
			for b.Loop() {
				b.StopTimer()
				ctx := context.Background()
				var s *sqlstore.Store
				if mode == sqlstore.LogMode {
					s = open(b, clients[0], sqlstore.Config{})
				} else {
					var err error
					s, err = sqlstore.NewPgx(pool, sqlstore.Config{Table: uniqueTable(), Logger: quietLog})
					require.NoError(b, err)
					require.NoError(b, s.Migrate(ctx))
					b.Cleanup(func() { _ = s.DropTables(context.Background()) })
				}
				snd := sender(b, s, outbox.Transactional)
				for i := 0; i < backlog; i += 10 {
					require.NoError(b, s.Transact(ctx, func(ctx context.Context) error {
						for j := range 10 {
							if err := snd.Send(ctx, message(fmt.Sprintf("k%d", (i+j)%200), i+j)); err != nil {
								return err
							}
						}
						return nil
					}))
				}
				rec := outboxtest.NewRecorder()
				cfg := relay.Config{Logger: quietLog, PollInterval: 50 * time.Millisecond}
				r, err := relay.New(s, rec, cfg)
				require.NoError(b, err)
				b.StartTimer()
				start := time.Now()
				require.NoError(b, r.Start(ctx))
				wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
				err = rec.WaitForUnique(wctx, backlog)
				cancel()
				require.NoError(b, err, "%d of %d published, relay stats %+v", rec.Unique(), backlog, r.Stats())
				took := time.Since(start)
				b.StopTimer()
				require.NoError(b, r.Stop(ctx))
				b.ReportMetric(backlog/took.Seconds(), "msgs/s")
				b.StartTimer()
			}
		})
	}
}
