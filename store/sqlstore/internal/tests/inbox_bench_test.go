package tests

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"database/sql"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/sqlstore"
)

// BenchmarkInboxOverhead compares a consumer's unit of work (one INSERT of its own,
// and 0 or 1 message sent) run through inbox.Process with the same unit run with
// Transact alone, on PostgreSQL through pgx and database/sql. Iterations alternate
// between the two so both see the same server state; "x-baseline" is the inbox's
// cost as a multiple of the unit alone. "duplicate-µs" is what a redelivered
// message costs: the key's INSERT finds it, and the unit rolls back.
func BenchmarkInboxOverhead(b *testing.B) {
	for _, be := range backends[:2] {
		for _, staged := range []int{0, 1} {
			b.Run(fmt.Sprintf("%s/staged=%d", be.name, staged), func(b *testing.B) {
				ctx := context.Background()
				s := be.open(b, sqlstore.Config{})
				orders := s.Config().Table + "_orders"
				execDirectTB(b, s, "CREATE TABLE "+orders+" (id BIGINT NOT NULL, customer TEXT NOT NULL)")
				b.Cleanup(func() { execDirectTB(b, s, "DROP TABLE IF EXISTS "+orders) })
				insert := "INSERT INTO " + orders + " (id, customer) VALUES (?, ?)"
				sender := capture(b, s, outbox.Transactional)
				in, err := inbox.New(s, inbox.Config{Consumer: "bench"})
				require.NoError(b, err)
				payload := randomPayload(256)

				var seq atomic.Int64
				handler := func(i int64) func(ctx context.Context) error {
					return func(ctx context.Context) error {
						if err := execInUnit(ctx, s, insert, i, "customer"); err != nil {
							return err
						}
						for range staged {
							if err := sender.Send(ctx, outbox.Message{Topic: "receipts", Key: fmt.Appendf(nil, "r-%d", i), Payload: payload}); err != nil {
								return err
							}
						}
						return nil
					}
				}
				var plainNs, inboxNs, dupNs, n int64
				b.ResetTimer()
				for b.Loop() {
					i := seq.Add(1)
					msg := &outbox.Message{Topic: "payments", Headers: []outbox.Header{{Key: outbox.HeaderIdempotencyKey, Value: []byte(uuid.NewString())}}}
					start := time.Now()
					if err := s.Transact(ctx, handler(i)); err != nil {
						b.Fatal(err)
					}
					mid := time.Now()
					if _, err := in.Process(ctx, msg, handler(i)); err != nil {
						b.Fatal(err)
					}
					end := time.Now()
					res, err := in.Process(ctx, msg, handler(i))
					if err != nil || !res.Duplicate {
						b.Fatalf("redelivery: %+v %v", res, err)
					}
					plainNs += int64(mid.Sub(start))
					inboxNs += int64(end.Sub(mid))
					dupNs += int64(time.Since(end))
					n++
				}
				b.StopTimer()
				if n > 0 {
					b.ReportMetric(float64(plainNs)/float64(n)/1e3, "plain-µs/msg")
					b.ReportMetric(float64(inboxNs)/float64(n)/1e3, "inbox-µs/msg")
					b.ReportMetric(float64(dupNs)/float64(n)/1e3, "duplicate-µs")
					b.ReportMetric(float64(inboxNs)/float64(plainNs), "x-baseline")
				}
			})
		}
	}
}

// execDirectTB is execDirect for benchmarks.
func execDirectTB(tb testing.TB, s *sqlstore.Store, q string, args ...any) {
	tb.Helper()
	ctx := context.Background()
	var pool *pgxpool.Pool
	var db *sql.DB
	var err error
	switch {
	case s.As(&pool):
		_, err = pool.Exec(ctx, rebind(q), args...)
	case s.As(&db):
		if s.Dialect() == sqlstore.PostgreSQL {
			q = rebind(q)
		}
		_, err = db.ExecContext(ctx, q, args...)
	}
	require.NoError(tb, err)
}
