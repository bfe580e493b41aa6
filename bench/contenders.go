package main

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// A contender is one way of writing messages in the business transaction and
// relaying them to Kafka.
type contender struct {
	name string
	open func(ctx context.Context, r *run) (instance, error)
}

// run is what one run of one contender gets: fresh tables (named with sfx) and a
// fresh Kafka cluster with one topic.
type run struct {
	env    *env
	broker *broker
	sfx    string
	topic  string
}

type instance interface {
	// write commits one business transaction (one order row) that also sends msgs,
	// and returns when its commit returned.
	write(ctx context.Context, order int64, msgs []message) (committed time.Time, err error)
	// fill writes part of a backlog into tx, as fast as the contender's own tables
	// allow; the caller commits tx and then calls committed, if not nil (the
	// outbox's wake-up).
	fill(ctx context.Context, tx pgx.Tx, msgs []message) (committed func(), err error)
	// queue names the table the relays read, for VACUUM and size statistics.
	queue() string
	// relay starts one relay, as a separate process would run it: its own
	// connections, its own Kafka client.
	relay(ctx context.Context, batch int) (runningRelay, error)
	// close drops the run's tables.
	close(ctx context.Context) error
}

type runningRelay interface {
	// held is how many buckets the relay holds leases on, -1 for relays without.
	held() int
	stop(ctx context.Context) error
}

// The contenders on PostgreSQL, in the order runs interleave.
var (
	business       = contender{name: "business tx", open: openBusinessPG}
	rawPG          = contender{name: "raw", open: openRawPG}
	watermillPG    = contender{name: "watermill", open: openWatermill}
	outboxPG       = contender{name: "outbox", open: openOutboxPG}
	outboxTransact = contender{name: "outbox (Transact)", open: openOutboxTransact}
	outboxLog      = contender{name: "outbox (log)", open: openOutboxLog}
)

// The contenders on MariaDB (write cost only).
var (
	businessMy = contender{name: "business tx", open: openBusinessMy}
	rawMy      = contender{name: "raw", open: openRawMy}
	outboxMy   = contender{name: "outbox", open: openOutboxMy}
)

// relayContenders are those the drain and latency scenarios compare.
var relayContenders = []contender{rawPG, watermillPG, outboxPG, outboxLog}

// A streamingInstance relays from a stream that one relay of the fleet reads (the
// log mode's replication slot): streaming reports whether a reader has it open.
type streamingInstance interface {
	streaming(ctx context.Context) (bool, error)
	// lag is how many bytes of WAL the stream's reader has not confirmed yet.
	lag(ctx context.Context) (int64, error)
}
