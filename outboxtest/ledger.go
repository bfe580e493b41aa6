package outboxtest

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
)

// Ledger is a test consumer's application state on a memory store: how many times
// each message's effect was applied, by message ID, and the payloads applied per
// key, in order. [Ledger.Apply] changes it through [memstore.OnCommit], so an effect
// counts only when its unit of work committed.
type Ledger struct {
	mu      sync.Mutex
	applied map[string]int
	order   map[string][]string
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{applied: map[string]int{}, order: map[string][]string{}}
}

// Apply is an [inbox.Handler] that records d's effect when its unit commits.
func (l *Ledger) Apply(ctx context.Context, d *inbox.Delivery) error {
	return memstore.OnCommit(ctx, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.applied[d.ID.String()]++
		l.order[string(d.Key)] = append(l.order[string(d.Key)], string(d.Payload))
		return nil
	})
}

// Len is the number of messages applied at least once.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.applied)
}

// Snapshot returns copies of the times each message ID was applied and of the
// payloads applied per key.
func (l *Ledger) Snapshot() (applied map[string]int, order map[string][]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	applied = make(map[string]int, len(l.applied))
	for k, v := range l.applied {
		applied[k] = v
	}
	order = make(map[string][]string, len(l.order))
	for k, v := range l.order {
		order[k] = append([]string(nil), v...)
	}
	return applied, order
}

// RequireOnce fails tb unless n messages were applied, each once, and returns the
// payloads applied per key, in order.
func (l *Ledger) RequireOnce(tb testing.TB, n int) (order map[string][]string) {
	tb.Helper()
	applied, order := l.Snapshot()
	require.Len(tb, applied, n, "messages applied")
	for id, times := range applied {
		require.Equal(tb, 1, times, "message %s applied once", id)
	}
	return order
}
