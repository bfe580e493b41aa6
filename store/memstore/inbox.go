package memstore

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"time"
	"weak"

	"github.com/outboxkit/outbox/inbox"
)

// inboxKeys holds one store's inbox records. It is read and written only under the
// store's lock.
type inboxKeys struct {
	expires map[inboxID]time.Time
}

type inboxID struct{ consumer, id string }

// inboxes maps a store to its records without keeping the store alive: the records
// go when the store is collected.
var inboxes sync.Map // weak.Pointer[Store] → *inboxKeys

func (s *Store) inboxKeys() *inboxKeys {
	wp := weak.Make(s)
	if v, ok := inboxes.Load(wp); ok {
		return v.(*inboxKeys)
	}
	v, loaded := inboxes.LoadOrStore(wp, &inboxKeys{expires: make(map[inboxID]time.Time)})
	if !loaded {
		runtime.AddCleanup(s, func(wp weak.Pointer[Store]) { inboxes.Delete(wp) }, wp)
	}
	return v.(*inboxKeys)
}

var _ inbox.Store = driverStore{}
var _ inbox.Remover = driverStore{}

// StageInboxKey records key in the unit of work on ctx, for an [inbox.Inbox]. It
// checks at once whether the key is recorded (returning an error wrapping
// [inbox.ErrDuplicate], so the consumer's function is skipped), and again at commit,
// under the store's lock, atomically with the unit's messages and its
// [OnCommit] applies: of two units racing on one key, one commits and the other
// fails with [inbox.ErrDuplicate], writing nothing.
//
// The record is inserted by an [OnCommit] apply registered here, first in the unit:
// if a later apply of the same unit returns an error, the key stays recorded, as
// the changes of earlier applies stay (OnCommit's rule).
func (s driverStore) StageInboxKey(ctx context.Context, key inbox.Key) (func(error) bool, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	keys := s.inboxKeys()
	id := inboxID{key.Consumer, key.ID}
	_, dup := keys.expires[id]
	s.mu.Unlock()
	if dup {
		return nil, fmt.Errorf("memstore: key %q of consumer %q: %w", key.ID, key.Consumer, inbox.ErrDuplicate)
	}
	// The apply runs under the store's lock.
	err := OnCommit(ctx, func() error {
		if _, dup := keys.expires[id]; dup {
			return fmt.Errorf("memstore: key %q of consumer %q was recorded by another unit meanwhile: %w", key.ID, key.Consumer, inbox.ErrDuplicate)
		}
		keys.expires[id] = key.ExpiresAt
		return nil
	})
	return nil, err
}

// RemoveInboxKeys deletes at most limit inbox keys that expired before before,
// oldest first.
func (s driverStore) RemoveInboxKeys(ctx context.Context, before time.Time, limit int) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	keys := s.inboxKeys()
	var expired []inboxID
	for id, at := range keys.expires {
		if at.Before(before) {
			expired = append(expired, id)
		}
	}
	sort.Slice(expired, func(i, j int) bool { return keys.expires[expired[i]].Before(keys.expires[expired[j]]) })
	if len(expired) > limit {
		expired = expired[:limit]
	}
	for _, id := range expired {
		delete(keys.expires, id)
	}
	return len(expired), nil
}
