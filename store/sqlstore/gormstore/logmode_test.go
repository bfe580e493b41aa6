package gormstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	gormpostgres "gorm.io/driver/postgres"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/pgcluster"
	"github.com/outboxkit/outbox/store/sqlstore"
	"github.com/outboxkit/outbox/store/sqlstore/gormstore"
)

// The log mode through gorm: a unit of work writes its business row with the gorm
// handle and its message into the write-ahead log, and no outbox row; the stream
// (on a replication connection from gorm's pgx stdlib connection settings) reads it.
func TestLogModeOnGorm(t *testing.T) {
	c := pgcluster.Start(t, pgcluster.Logical)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db, err := openServer(gormpostgres.Open(c.URL("postgres")))
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	defer sqlDB.Close()
	s, err := gormstore.New(db, sqlstore.Config{Mode: sqlstore.LogMode})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	defer s.Close()
	require.NoError(t, db.Exec("CREATE TABLE orders (id SERIAL PRIMARY KEY, customer TEXT NOT NULL)").Error)

	sender, err := outbox.NewSender(s, outbox.SenderConfig{})
	require.NoError(t, err)
	require.NoError(t, s.Transact(ctx, func(ctx context.Context) error {
		tx, ok := gormstore.Tx(ctx)
		require.True(t, ok)
		if err := tx.Exec("INSERT INTO orders (customer) VALUES (?)", "c1").Error; err != nil {
			return err
		}
		return sender.Send(ctx, outbox.Message{Topic: "orders", Key: []byte("c1"), Payload: []byte("placed")})
	}))
	var rows int64
	require.NoError(t, db.Table(s.Config().Table).Count(&rows).Error)
	require.Zero(t, rows)

	st, err := s.Driver().(driver.Streamer).OpenStream(ctx)
	require.NoError(t, err)
	defer st.Close(context.Background())
	for {
		envs, _, err := st.Next(ctx)
		require.NoError(t, err)
		if len(envs) > 0 {
			require.Len(t, envs, 1)
			require.Equal(t, "placed", string(envs[0].Payload))
			return
		}
	}
}
