package chaos

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
)

// Config sizes a chaos run. The zero value of every field selects its default, which
// together make a run of a few seconds that CI can afford.
type Config struct {
	// Messages is how many messages the writers capture, rolled back ones included.
	// Defaults to 2,000.
	Messages int
	// Keys is the number of distinct message keys. Each key belongs to one writer,
	// which writes it in order, so commit order per key is well defined. Defaults to 64.
	Keys int
	// Writers is the number of concurrent writers. Defaults to 4.
	Writers int
	// UnitSize is the most messages one unit of work captures; each unit takes between
	// 1 and UnitSize. Defaults to 5.
	UnitSize int
	// RollbackShare is the fraction of units of work, from 0 to 1, rolled back on
	// purpose after staging their messages. Defaults to 0.1; a negative value rolls
	// nothing back.
	RollbackShare float64
	// Relays is the number of dispatchers sharing the store. Defaults to 3.
	Relays int
	// BucketCount is the store's and every relay's bucket count. Defaults to 16.
	BucketCount int
	// BatchSize is each dispatcher's batch size. Defaults to 50.
	BatchSize int
	// LeaseDuration is each dispatcher's lease duration, scaled down so crashed relays'
	// buckets move within the run. Defaults to 1.5 s.
	LeaseDuration time.Duration
	// LeaseRenewInterval defaults to a fifth of LeaseDuration.
	LeaseRenewInterval time.Duration
	// StoreTimeout bounds each relay's store calls. Defaults to half of LeaseDuration:
	// at these scaled-down timings a store call on a busy machine can take longer than
	// LeaseRenewInterval, and a lease write that lands after its caller gave up is
	// refused on the next round, which a run counts but does not need to provoke.
	StoreTimeout time.Duration
	// PollInterval defaults to 20 ms.
	PollInterval time.Duration
	// BackoffBase and BackoffMax bound the dispatchers' retry delays, short so the
	// backlog drains soon after the faults end. Default to 5 ms and 150 ms.
	BackoffBase, BackoffMax time.Duration
	// MaxAttempts is each dispatcher's attempt limit. A parked message is a lost
	// message for this run, so it defaults to 1,000,000: transient faults never park.
	MaxAttempts int
	// Faults is the fault schedule.
	Faults Schedule
	// DrainTimeout is how long, after the faults end and the writers finish, every
	// committed message has to arrive before the run fails. Defaults to 60 s.
	DrainTimeout time.Duration
	// Seed seeds the writers' and the faults' random choices. Defaults to 1.
	Seed uint64
	// Reopen, if set, opens another handle on the store the harness made — the same
	// tables, the same table name and key prefix — as a separate process would open
	// it. Each relay then works through a handle of its own, so nothing the store
	// keeps in memory (caches, wake-ups) is shared between writers and relays that a
	// real deployment runs apart. The run closes the handles. Defaults to nil: every
	// relay uses the harness's store, as for a store that lives in one process.
	Reopen func(t *testing.T, s outboxtest.Store) outboxtest.Store
	// Logger receives the dispatchers' and the capture's logs. Defaults to a logger
	// that drops everything: faults make the dispatchers warn a lot.
	Logger *slog.Logger
}

// Schedule is when and which faults are injected. All faults start and stop within
// the fault phase, which lasts Duration from the moment the relays start; the writers
// run during it too.
type Schedule struct {
	// Duration is the length of the fault phase. Defaults to 4 s.
	Duration time.Duration
	// None turns every fault off: a clean run, for comparison.
	None bool
	// MessageErrorRate is the probability that one message of a publish fails
	// transiently. Defaults to 0.05.
	MessageErrorRate float64
	// BatchErrorRate is the probability that a whole publish fails. Defaults to 0.02.
	BatchErrorRate float64
	// Latency is added to every publish, plus up to Jitter more. Default to 1 ms and
	// 2 ms.
	Latency, Jitter time.Duration
	// Outage is how long the broker refuses every publish, starting a quarter into
	// the fault phase. Defaults to a fifth of Duration; negative means no outage.
	Outage time.Duration
	// GracefulStops is how many times a relay is stopped gracefully (and started again
	// a little later). Defaults to 1; negative means none.
	GracefulStops int
	// Crashes is how many times a relay is stopped without releasing its leases, as a
	// killed process would be; it comes back under a new ID when the fault phase ends.
	// Crashes must leave at least one relay running. Defaults to 1; negative means none.
	Crashes int
	// ClockSetBack sets the clock of relay 0 back by this much from an eighth into the
	// fault phase until its end. Defaults to a quarter of LeaseDuration: the outbox
	// asks for clocks kept well within LeaseDuration − LeaseRenewInterval of each
	// other, and a larger jump on a loaded machine can let two relays publish one
	// bucket, which the run would report as out of order. Negative means never.
	ClockSetBack time.Duration
}

func (c Config) withDefaults() (Config, error) {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Messages, 2000)
	def(&c.Keys, 64)
	def(&c.Writers, 4)
	def(&c.UnitSize, 5)
	def(&c.Relays, 3)
	def(&c.BucketCount, 16)
	def(&c.BatchSize, 50)
	def(&c.MaxAttempts, 1_000_000)
	if c.RollbackShare == 0 {
		c.RollbackShare = 0.1
	} else if c.RollbackShare < 0 {
		c.RollbackShare = 0
	}
	defDur(&c.LeaseDuration, 1500*time.Millisecond)
	defDur(&c.LeaseRenewInterval, c.LeaseDuration/5)
	defDur(&c.StoreTimeout, c.LeaseDuration/2)
	defDur(&c.PollInterval, 20*time.Millisecond)
	defDur(&c.BackoffBase, 5*time.Millisecond)
	defDur(&c.BackoffMax, 150*time.Millisecond)
	defDur(&c.DrainTimeout, 60*time.Second)
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	f := &c.Faults
	defDur(&f.Duration, 4*time.Second)
	if f.None {
		f.MessageErrorRate, f.BatchErrorRate = 0, 0
		f.Latency, f.Jitter = 0, 0
		f.Outage, f.GracefulStops, f.Crashes, f.ClockSetBack = -1, -1, -1, -1
	}
	if f.MessageErrorRate == 0 {
		f.MessageErrorRate = 0.05
	}
	if f.BatchErrorRate == 0 {
		f.BatchErrorRate = 0.02
	}
	defDur(&f.Latency, time.Millisecond)
	defDur(&f.Jitter, 2*time.Millisecond)
	defDur(&f.Outage, f.Duration/5)
	def(&f.GracefulStops, 1)
	def(&f.Crashes, 1)
	defDur(&f.ClockSetBack, c.LeaseDuration/4)
	f.MessageErrorRate = max(f.MessageErrorRate, 0)
	f.BatchErrorRate = max(f.BatchErrorRate, 0)
	f.Latency, f.Jitter = max(f.Latency, 0), max(f.Jitter, 0)
	f.Outage = max(f.Outage, 0)
	f.GracefulStops, f.Crashes = max(f.GracefulStops, 0), max(f.Crashes, 0)
	f.ClockSetBack = max(f.ClockSetBack, 0)
	return c, c.validate()
}

// Validate reports the first setting that cannot work, naming its field, with an
// error wrapping [outbox.ErrMisconfigured]. Zero values take their defaults.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: chaos: Config.%s %s", outbox.ErrMisconfigured, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Messages < 1:
		return bad("Messages", "is %d; it must be at least 1", c.Messages)
	case c.Keys < 1:
		return bad("Keys", "is %d; it must be at least 1", c.Keys)
	case c.Writers < 1 || c.Writers > c.Keys:
		return bad("Writers", "is %d; it must be between 1 and Keys (%d), as each key has one writer", c.Writers, c.Keys)
	case c.UnitSize < 1:
		return bad("UnitSize", "is %d; it must be at least 1", c.UnitSize)
	case c.RollbackShare >= 1:
		return bad("RollbackShare", "is %g; it must be below 1", c.RollbackShare)
	case c.Relays < 1:
		return bad("Relays", "is %d; it must be at least 1", c.Relays)
	case c.Faults.Crashes >= c.Relays:
		return bad("Faults.Crashes", "is %d; crashes must leave one of the %d relays running", c.Faults.Crashes, c.Relays)
	case c.Faults.MessageErrorRate > 1:
		return bad("Faults.MessageErrorRate", "is %g; it must be at most 1", c.Faults.MessageErrorRate)
	case c.Faults.BatchErrorRate > 1:
		return bad("Faults.BatchErrorRate", "is %g; it must be at most 1", c.Faults.BatchErrorRate)
	case c.Faults.Outage >= c.Faults.Duration/2:
		return bad("Faults.Outage", "is %s; it must be under half of Faults.Duration (%s)", c.Faults.Outage, c.Faults.Duration)
	}
	return nil
}
