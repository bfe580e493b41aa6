package gormstore_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/gormstore"
)

// TestInboxConformance runs the inbox suite on every database through gorm: the
// consumer's function writes a row of its own through gormstore.Tx.
func TestInboxConformance(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			dbs := map[outboxtest.Store]*gorm.DB{}
			outboxtest.RunInboxTests(t, outboxtest.InboxHarness{
				New: func(t *testing.T) outboxtest.Store {
					db := b.db(t)
					s := open(t, db, sqlstore.Config{BucketCount: 1})
					effects := s.Config().Table + "_effects"
					require.NoError(t, db.Exec("CREATE TABLE "+effects+" (k VARCHAR(100) NOT NULL)").Error)
					t.Cleanup(func() { _ = db.Exec("DROP TABLE IF EXISTS " + effects).Error })
					mu.Lock()
					dbs[s] = db
					mu.Unlock()
					return s
				},
				Effect: func(ctx context.Context, st outboxtest.Store, key string) error {
					tx, ok := gormstore.Tx(ctx)
					if !ok {
						return errors.New("no gorm transaction on ctx")
					}
					if len(key) > 100 {
						key = key[:100]
					}
					return tx.Exec("INSERT INTO "+st.(*sqlstore.Store).Config().Table+"_effects (k) VALUES (?)", key).Error
				},
				Effects: func(t *testing.T, st outboxtest.Store, key string) int {
					mu.Lock()
					db := dbs[st]
					mu.Unlock()
					if len(key) > 100 {
						key = key[:100]
					}
					var n int64
					require.NoError(t, db.Table(st.(*sqlstore.Store).Config().Table+"_effects").Where("k = ?", key).Count(&n).Error)
					return int(n)
				},
			})
		})
	}
}
