package dynamodb

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/outboxkit/outbox"
)

// Defaults of [Options].
const (
	DefaultPartitionKeyAttributeName = "PK"
	DefaultSortKeyAttributeName      = "SK"
	DefaultKeyPrefix                 = "OUTBOX"
	DefaultMaxConcurrency            = 8
	DefaultPendingCountLimit         = 10_000
)

// Options configure a [Store] and the table helpers. Every writer and relay that
// shares a table must use the same TableName, key attribute names, KeyPrefix and
// BucketCount.
type Options struct {
	// TableName is the table that holds the outbox items. Required.
	TableName string
	// PartitionKeyAttributeName names the table's string partition key. Defaults to
	// "PK".
	PartitionKeyAttributeName string
	// SortKeyAttributeName names the table's string sort key. Defaults to "SK".
	SortKeyAttributeName string
	// KeyPrefix starts every partition key value the outbox writes, so several
	// outboxes, or the outbox and the application's own items, can share one table.
	// It must not contain '#'. Defaults to "OUTBOX".
	KeyPrefix string
	// BucketCount is the number of buckets. It must equal the count writers stamp on
	// envelopes and the dispatcher's count. Defaults to [outbox.DefaultBucketCount].
	BucketCount int
	// MaxConcurrency bounds the DynamoDB requests one store call has in flight at once
	// (sequence reservations across buckets, gap probes, delete batches, per-bucket
	// samples). Defaults to 8.
	MaxConcurrency int
	// PendingCountLimit caps how many pending messages [Store.Stats] counts per
	// bucket: DynamoDB bills a count as a read of every item counted. Defaults to
	// 10,000.
	PendingCountLimit int
	// Logger receives warnings (deletes left unprocessed after every retry). Defaults
	// to [slog.Default].
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.PartitionKeyAttributeName == "" {
		o.PartitionKeyAttributeName = DefaultPartitionKeyAttributeName
	}
	if o.SortKeyAttributeName == "" {
		o.SortKeyAttributeName = DefaultSortKeyAttributeName
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = DefaultKeyPrefix
	}
	if o.BucketCount == 0 {
		o.BucketCount = outbox.DefaultBucketCount
	}
	if o.MaxConcurrency == 0 {
		o.MaxConcurrency = DefaultMaxConcurrency
	}
	if o.PendingCountLimit == 0 {
		o.PendingCountLimit = DefaultPendingCountLimit
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports the first option that cannot work, naming it. Zero values other
// than TableName are valid: they take their defaults.
func (o Options) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: dynamodb: "+format, append([]any{outbox.ErrMisconfigured}, args...)...)
	}
	switch {
	case o.TableName == "":
		return bad("Options.TableName is required")
	case len(o.TableName) < 3 || len(o.TableName) > 255:
		return bad("Options.TableName %q must be 3 to 255 characters long", o.TableName)
	case !validTableName(o.TableName):
		return bad("Options.TableName %q may only hold letters, digits, '_', '-' and '.'", o.TableName)
	case strings.Contains(o.KeyPrefix, "#"):
		return bad("Options.KeyPrefix %q must not contain '#', which separates the parts of a key", o.KeyPrefix)
	case o.PartitionKeyAttributeName != "" && o.PartitionKeyAttributeName == o.SortKeyAttributeName:
		return bad("Options.PartitionKeyAttributeName and Options.SortKeyAttributeName are both %q", o.SortKeyAttributeName)
	case o.BucketCount < 0:
		return bad("Options.BucketCount is %d; it must be at least 1 (or 0 for the default %d)", o.BucketCount, outbox.DefaultBucketCount)
	case o.MaxConcurrency < 0:
		return bad("Options.MaxConcurrency is %d; it must be at least 1 (or 0 for the default %d)", o.MaxConcurrency, DefaultMaxConcurrency)
	case o.PendingCountLimit < 0:
		return bad("Options.PendingCountLimit is %d; it must be at least 1 (or 0 for the default %d)", o.PendingCountLimit, DefaultPendingCountLimit)
	}
	if d := o.withDefaults(); d.PartitionKeyAttributeName == d.SortKeyAttributeName {
		return bad("Options.PartitionKeyAttributeName and Options.SortKeyAttributeName are both %q", d.SortKeyAttributeName)
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
