package dynamostore

import (
	"fmt"
	"log/slog"
	"strings"
	"unicode/utf8"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// Defaults of [Config].
const (
	DefaultPartitionKeyAttributeName = "PK"
	DefaultSortKeyAttributeName      = "SK"
	DefaultKeyPrefix                 = "OUTBOX"
	DefaultMaxConcurrency            = 8
	DefaultPendingCountLimit         = 10_000
)

// Config configures a [Store] and the table helpers. Every writer and relay that
// shares a table must use the same TableName, key attribute names, KeyPrefix and
// BucketCount. Only TableName is required: every other zero value takes the default
// its field documents.
type Config struct {
	// TableName is the table that holds the outbox items. Required.
	TableName string
	// PartitionKeyAttributeName names the table's string partition key. Defaults to
	// "PK".
	PartitionKeyAttributeName string
	// SortKeyAttributeName names the table's string sort key. Defaults to "SK".
	SortKeyAttributeName string
	// KeyPrefix starts every partition key value the outbox writes, so several
	// outboxes, or the outbox and the application's own items, can share one table.
	// It must not contain '#', and may be at most 2,028 bytes long (DynamoDB limits a
	// partition key value to 2,048 bytes). Every byte of it is taken from
	// [Store.MaxMessageSize]. Defaults to "OUTBOX".
	KeyPrefix string
	// BucketCount is the number of buckets. Every store and relay sharing the table
	// must use the same count: the store stamps every message it writes with it, and
	// a relay whose own count is zero takes it from the store. Defaults to
	// [driver.DefaultBucketCount].
	BucketCount int
	// MaxConcurrency bounds the DynamoDB requests one store call has in flight at once
	// (sequence reservations across buckets, gap probes, delete batches, per-bucket
	// samples). Defaults to 8.
	MaxConcurrency int
	// PendingCountLimit caps how many pending messages the relay side's Stats
	// counts per bucket: DynamoDB bills a count as a read of every item counted.
	// Defaults to 10,000.
	PendingCountLimit int
	// Logger receives warnings (deletes left unprocessed after every retry). Defaults
	// to [slog.Default].
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.PartitionKeyAttributeName == "" {
		c.PartitionKeyAttributeName = DefaultPartitionKeyAttributeName
	}
	if c.SortKeyAttributeName == "" {
		c.SortKeyAttributeName = DefaultSortKeyAttributeName
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.BucketCount == 0 {
		c.BucketCount = driver.DefaultBucketCount
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	if c.PendingCountLimit == 0 {
		c.PendingCountLimit = DefaultPendingCountLimit
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first setting that cannot work, naming its field. Zero values other
// than TableName are valid: they take their defaults.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: dynamostore: "+format, append([]any{outbox.ErrMisconfigured}, args...)...)
	}
	switch {
	case c.TableName == "":
		return bad("Config.TableName is required")
	case len(c.TableName) < 3 || len(c.TableName) > 255:
		return bad("Config.TableName %q must be 3 to 255 characters long", c.TableName)
	case !validTableName(c.TableName):
		return bad("Config.TableName %q may only hold letters, digits, '_', '-' and '.'", c.TableName)
	case strings.Contains(c.KeyPrefix, "#"):
		return bad("Config.KeyPrefix %q must not contain '#', which separates the parts of a key", c.KeyPrefix)
	case len(c.KeyPrefix) > maxKeyPrefix:
		return bad("Config.KeyPrefix is %d bytes; DynamoDB limits a partition key value to %d bytes, which leaves at most %d for the prefix", len(c.KeyPrefix), maxPartitionKey, maxKeyPrefix)
	case !utf8.ValidString(c.KeyPrefix):
		return bad("Config.KeyPrefix is not valid UTF-8, which a string key must be")
	case len(c.PartitionKeyAttributeName) > 255:
		return bad("Config.PartitionKeyAttributeName is %d bytes; DynamoDB limits a key attribute name to 255", len(c.PartitionKeyAttributeName))
	case len(c.SortKeyAttributeName) > 255:
		return bad("Config.SortKeyAttributeName is %d bytes; DynamoDB limits a key attribute name to 255", len(c.SortKeyAttributeName))
	case c.PartitionKeyAttributeName != "" && c.PartitionKeyAttributeName == c.SortKeyAttributeName:
		return bad("Config.PartitionKeyAttributeName and Config.SortKeyAttributeName are both %q", c.SortKeyAttributeName)
	case c.BucketCount < 0:
		return bad("Config.BucketCount is %d; it must be at least 1 (or 0 for the default %d)", c.BucketCount, driver.DefaultBucketCount)
	case c.MaxConcurrency < 0:
		return bad("Config.MaxConcurrency is %d; it must be at least 1 (or 0 for the default %d)", c.MaxConcurrency, DefaultMaxConcurrency)
	case c.PendingCountLimit < 0:
		return bad("Config.PendingCountLimit is %d; it must be at least 1 (or 0 for the default %d)", c.PendingCountLimit, DefaultPendingCountLimit)
	}
	if d := c.withDefaults(); d.PartitionKeyAttributeName == d.SortKeyAttributeName {
		return bad("Config.PartitionKeyAttributeName and Config.SortKeyAttributeName are both %q", d.SortKeyAttributeName)
	}
	return nil
}

func validTableName(name string) bool {
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
		default:
			return false
		}
	}
	return true
}
