package relay

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/outboxkit/outbox"
)

// Config tunes a [Relay]. The zero value of every field selects its default, so
// Config{} is a working configuration.
type Config struct {
	// RelayID names this relay in leases and heartbeats. It must be unique among live
	// relays: two processes sharing one ID would both publish the same buckets. Each
	// heartbeat carries the process's identity ([Relay.Instance]), so both relays
	// notice such a clash: they log it at ERROR and count it in
	// [Stats.InstanceClashes]. Defaults to the host name plus a random suffix.
	RelayID string
	// BucketCount is the number of buckets the relay divides with its peers. Defaults
	// to the store's count (driver.Store.BucketCount), which is what it must
	// be: leave it 0. A non-zero value that differs from the store's makes [New] fail
	// with [outbox.ErrMisconfigured].
	BucketCount int
	// BatchSize is the most envelopes fetched from one bucket and published in one
	// Transport.Publish call. Defaults to 100.
	BatchSize int
	// PollInterval is how often the worker looks for due envelopes when no wake-up
	// arrives. Defaults to 1 s.
	PollInterval time.Duration
	// LeaseDuration is how long a bucket lease and a heartbeat stay valid. A crashed
	// relay's buckets move to its peers this long after its last renewal. Defaults to
	// 30 s.
	LeaseDuration time.Duration
	// LeaseRenewInterval is how often the relay writes its heartbeat, re-plans and
	// renews its leases. It must be at most a third of LeaseDuration. It also spaces
	// the warnings about failed publishes: at most one per bucket per interval.
	// Defaults to 10 s.
	LeaseRenewInterval time.Duration
	// StoreTimeout bounds every store call the relay makes (but the check at Start,
	// which LeaseDuration bounds), so a connection that hangs
	// (a black-holed network path) fails the call instead of wedging the relay. Raise
	// it for a store behind a slow link whose lease writes take longer than
	// LeaseRenewInterval; it must be at most LeaseDuration. Defaults to
	// LeaseRenewInterval.
	StoreTimeout time.Duration
	// MaxAttempts is how many failed publish attempts park an envelope. Defaults to 10.
	MaxAttempts int
	// BackoffBase is the delay after the first failure; each further failure doubles
	// it. Defaults to 30 s.
	BackoffBase time.Duration
	// BackoffMax caps the delay. Defaults to 1 h.
	BackoffMax time.Duration
	// Jitter is the fraction of each delay drawn at random and taken off, in [0, 1], so
	// failures that happened together do not retry together. Defaults to 0.2; a
	// negative value turns jitter off.
	Jitter float64
	// Retention keeps dispatched envelopes this long (the store must implement
	// driver.Retainer); 0 deletes them once the broker acknowledged them. The relay
	// that owns bucket 0 deletes expired ones. Defaults to 0.
	Retention time.Duration
	// Unordered lets a failed envelope retry later without holding back the later
	// envelopes of its key. Defaults to false: per-key order is kept.
	Unordered bool
	// MaxConcurrency is how many buckets are drained in parallel. Defaults to 4.
	MaxConcurrency int
	// Logger receives the relay's logs, each with a "relay" attribute; the
	// package documentation lists what is logged at which level. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock, for tests. Defaults to time.Now.
	Now func() time.Time
	// Observer receives every measurement (publishes, retries, parks, refused
	// writes, rounds, backlog samples) as it happens, for metrics: see [Observer].
	// Package outboxotel turns them into OpenTelemetry instruments. Defaults to nil:
	// nothing is observed and nothing is paid for it.
	Observer Observer
	// BacklogInterval is how often the relay that holds bucket 0 samples the
	// backlog (pending messages per bucket, oldest pending message, parked messages)
	// through the store's driver.BacklogSampler or driver.Admin, for [Stats.Backlog]
	// and the Observer. Only that relay samples, so the cost does not grow with the
	// fleet; samples are taken after a coordination round of the worker, so the
	// effective interval is a multiple of the round interval. A negative value turns
	// sampling off. Defaults to 30 s.
	BacklogInterval time.Duration
	// StreamRetryBudget is, for a store whose messages come as a stream
	// ([driver.Streamer]: the SQL store's log mode), how long the relay reading the
	// stream retries a failed publish in place before it moves the message, and every
	// later message of its key while the key is held, into the store's table, where
	// the envelopes are retried with backoff and parked as any other. Other keys keep
	// streaming meanwhile only once the message has moved. Defaults to 3 s, or half
	// of LeaseDuration − LeaseRenewInterval if that is shorter.
	StreamRetryBudget time.Duration
}

// Defaults.
const (
	DefaultBatchSize          = 100
	DefaultPollInterval       = time.Second
	DefaultLeaseDuration      = 30 * time.Second
	DefaultLeaseRenewInterval = 10 * time.Second
	DefaultMaxAttempts        = 10
	DefaultBackoffBase        = 30 * time.Second
	DefaultBackoffMax         = time.Hour
	DefaultJitter             = 0.2
	DefaultMaxConcurrency     = 4
	DefaultStreamRetryBudget  = 3 * time.Second
)

// retentionBatch bounds one DeleteDispatched call; retentionRounds bounds the calls
// per sweep so cleanup never starves publishing.
const (
	retentionBatch  = 1000
	retentionRounds = 10
)

// withDefaults returns c with every zero field set to its default, except the two
// that [New] fills: RelayID (it draws a random suffix) and BucketCount (it comes from
// the store).
func (c Config) withDefaults() Config {
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.LeaseRenewInterval == 0 {
		c.LeaseRenewInterval = DefaultLeaseRenewInterval
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = c.LeaseRenewInterval
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = DefaultBackoffMax
	}
	switch {
	case c.Jitter == 0:
		c.Jitter = DefaultJitter
	case c.Jitter < 0:
		c.Jitter = 0
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.BacklogInterval == 0 {
		c.BacklogInterval = DefaultBacklogInterval
	}
	if c.StreamRetryBudget == 0 {
		c.StreamRetryBudget = min(DefaultStreamRetryBudget, (c.LeaseDuration-c.LeaseRenewInterval)/2)
	}
	return c
}

// Validate reports the first setting that cannot work, as an error wrapping
// [outbox.ErrMisconfigured] that names the field and what it must be. Zero fields
// take their defaults first, so the zero Config is valid. [New] calls it; whether
// BucketCount matches the store, and whether the store supports Retention, only New
// can tell.
func (c Config) Validate() error {
	return c.withDefaults().validate()
}

// validate checks a config that has its defaults applied.
func (c Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: relay.Config.%s %s", outbox.ErrMisconfigured, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.BucketCount < 0:
		return bad("BucketCount", "is %d; leave it 0 to take the store's bucket count", c.BucketCount)
	case c.BatchSize < 1:
		return bad("BatchSize", "is %d; it must be at least 1", c.BatchSize)
	case c.PollInterval < 0:
		return bad("PollInterval", "is %s; it must be positive (0 selects %s)", c.PollInterval, DefaultPollInterval)
	case c.LeaseDuration < 0:
		return bad("LeaseDuration", "is %s; it must be positive (0 selects %s)", c.LeaseDuration, DefaultLeaseDuration)
	case c.LeaseRenewInterval < 0:
		return bad("LeaseRenewInterval", "is %s; it must be positive (0 selects %s)", c.LeaseRenewInterval, DefaultLeaseRenewInterval)
	case c.LeaseRenewInterval*3 > c.LeaseDuration:
		return bad("LeaseRenewInterval", "is %s; it must be at most a third of LeaseDuration (%s) so a lease survives a missed renewal", c.LeaseRenewInterval, c.LeaseDuration)
	case c.StoreTimeout < 0:
		return bad("StoreTimeout", "is %s; it must be positive (0 selects LeaseRenewInterval)", c.StoreTimeout)
	case c.StoreTimeout > c.LeaseDuration:
		return bad("StoreTimeout", "is %s; it must be at most LeaseDuration (%s): a lease write that may take longer than the lease cannot keep it", c.StoreTimeout, c.LeaseDuration)
	case c.MaxAttempts < 1:
		return bad("MaxAttempts", "is %d; it must be at least 1", c.MaxAttempts)
	case c.BackoffBase < 0:
		return bad("BackoffBase", "is %s; it must be positive (0 selects %s)", c.BackoffBase, DefaultBackoffBase)
	case c.BackoffMax < c.BackoffBase:
		return bad("BackoffMax", "is %s; it must be at least BackoffBase (%s)", c.BackoffMax, c.BackoffBase)
	case c.Jitter > 1:
		return bad("Jitter", "is %g; it must be at most 1", c.Jitter)
	case c.Retention < 0:
		return bad("Retention", "is %s; it must be 0 (delete on completion) or positive", c.Retention)
	case c.MaxConcurrency < 1:
		return bad("MaxConcurrency", "is %d; it must be at least 1", c.MaxConcurrency)
	case c.StreamRetryBudget < 0:
		return bad("StreamRetryBudget", "is %s; it must be positive (0 selects %s)", c.StreamRetryBudget, DefaultStreamRetryBudget)
	case c.StreamRetryBudget >= c.LeaseDuration-c.LeaseRenewInterval:
		return bad("StreamRetryBudget", "is %s; it must be shorter than LeaseDuration − LeaseRenewInterval (%s), so the stream's reader keeps its lease while it retries", c.StreamRetryBudget, c.LeaseDuration-c.LeaseRenewInterval)
	}
	return nil
}

func defaultRelayID() (string, error) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "relay"
	}
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return "", fmt.Errorf("relay: relay id: %w", err)
	}
	return host + "-" + hex.EncodeToString(suffix[:]), nil
}
