package kafkatransport

import (
	"context"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kgo"
)

// recordMeta travels on the Context of a record with an explicit partition, so the
// partitioner can see the partition and report back when it does not exist.
type recordMeta struct {
	explicit int32
	// missing is set by the partitioner when the explicit partition does not exist.
	missing atomic.Bool
}

type metaKey struct{}

func metaOf(r *kgo.Record) *recordMeta {
	if r.Context == nil {
		return nil
	}
	m, _ := r.Context.Value(metaKey{}).(*recordMeta)
	return m
}

func withMeta(ctx context.Context, m *recordMeta) context.Context {
	return context.WithValue(ctx, metaKey{}, m)
}

// Partitioner returns a kgo partitioner that sends records carrying an explicit
// partition (an envelope with [outbox.Message.Partition] set) to that partition, and
// hands every other record to fallback. A nil fallback is kgo's default partitioner,
// UniformBytesPartitioner(64 KiB, adaptive, keys, murmur2), which puts keyed records
// where Kafka's Java client does.
//
// Configure the client the transport uses with it to publish messages that name a
// partition:
//
//	client, err := kgo.NewClient(
//		kgo.SeedBrokers(brokers...),
//		kgo.RecordPartitioner(kafkatransport.Partitioner(nil)),
//	)
//
// Records produced on the same client by other code (without the transport's marker)
// always go to fallback, so the client can be shared.
func Partitioner(fallback kgo.Partitioner) kgo.Partitioner {
	if fallback == nil {
		fallback = kgo.UniformBytesPartitioner(64<<10, true, true, nil)
	}
	return &explicitPartitioner{fallback: fallback}
}

type explicitPartitioner struct {
	fallback kgo.Partitioner
}

// ForTopic mirrors the optional interfaces of the fallback's topic partitioner: kgo
// calls PartitionByBackup instead of Partition when it exists (the default
// partitioner panics in Partition), and OnNewBatch only when it exists.
func (p *explicitPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	inner := p.fallback.ForTopic(topic)
	base := explicitTopic{inner: inner}
	backup, hasBackup := inner.(kgo.TopicBackupPartitioner)
	onNewBatch, hasOnNewBatch := inner.(kgo.TopicPartitionerOnNewBatch)
	switch {
	case hasBackup && hasOnNewBatch:
		return &explicitBackupBatchTopic{explicitBackupTopic{base, backup}, onNewBatch}
	case hasBackup:
		return &explicitBackupTopic{base, backup}
	case hasOnNewBatch:
		return &explicitBatchTopic{base, onNewBatch}
	default:
		return &base
	}
}

type explicitTopic struct {
	inner kgo.TopicPartitioner
}

// explicitPick returns the partition index for a record with an explicit partition.
// With RequiresConsistency true, kgo offers every partition of the topic in order, so
// the index is the partition number. A partition that does not exist yields -1,
// which kgo fails at once; the mark lets Publish report it as permanent.
func explicitPick(r *kgo.Record, n int) (int, bool) {
	m := metaOf(r)
	if m == nil {
		return 0, false
	}
	if int(m.explicit) >= n {
		m.missing.Store(true)
		return -1, true
	}
	return int(m.explicit), true
}

func (t *explicitTopic) RequiresConsistency(r *kgo.Record) bool {
	if metaOf(r) != nil {
		return true
	}
	return t.inner.RequiresConsistency(r)
}

func (t *explicitTopic) Partition(r *kgo.Record, n int) int {
	if pick, ok := explicitPick(r, n); ok {
		return pick
	}
	return t.inner.Partition(r, n)
}

type explicitBackupTopic struct {
	explicitTopic
	backup kgo.TopicBackupPartitioner
}

func (t *explicitBackupTopic) PartitionByBackup(r *kgo.Record, n int, it kgo.TopicBackupIter) int {
	if pick, ok := explicitPick(r, n); ok {
		return pick
	}
	return t.backup.PartitionByBackup(r, n, it)
}

type explicitBatchTopic struct {
	explicitTopic
	onNewBatch kgo.TopicPartitionerOnNewBatch
}

func (t *explicitBatchTopic) OnNewBatch() { t.onNewBatch.OnNewBatch() }

type explicitBackupBatchTopic struct {
	explicitBackupTopic
	onNewBatch kgo.TopicPartitionerOnNewBatch
}

func (t *explicitBackupBatchTopic) OnNewBatch() { t.onNewBatch.OnNewBatch() }
