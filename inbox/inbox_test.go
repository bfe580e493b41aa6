package inbox_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/inbox"
	"github.com/outboxkit/outbox/store/memstore"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		cfg   inbox.Config
		field string
	}{
		{inbox.Config{}, "Config.Consumer"},
		{inbox.Config{Consumer: strings.Repeat("c", inbox.MaxConsumerLength+1)}, "Config.Consumer"},
		{inbox.Config{Consumer: "\xff"}, "Config.Consumer"},
		{inbox.Config{Consumer: "c", Retention: -1}, "Config.Retention"},
		{inbox.Config{Consumer: "c", RemoveBatch: -1}, "Config.RemoveBatch"},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		require.ErrorIs(t, err, outbox.ErrMisconfigured, "%+v", c.cfg)
		require.ErrorContains(t, err, c.field)
	}
	require.NoError(t, inbox.Config{Consumer: "billing"}.Validate())
}

// transactorOnly is a unit of work that cannot record inbox keys.
type transactorOnly struct{}

func (transactorOnly) Transact(ctx context.Context, fn func(context.Context) error) error {
	return fn(ctx)
}

func TestNewRefusesStoreWithoutCapability(t *testing.T) {
	_, err := inbox.New(transactorOnly{}, inbox.Config{Consumer: "billing"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "StageInboxKey", "the error names what the store lacks")
	_, err = inbox.New(nil, inbox.Config{Consumer: "billing"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)

	st, err := memstore.New(memstore.Config{})
	require.NoError(t, err)
	defer st.Close()
	_, err = inbox.New(st, inbox.Config{})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	in, err := inbox.New(st, inbox.Config{Consumer: "billing"})
	require.NoError(t, err)
	_, err = in.Process(context.Background(), &outbox.Message{}, nil)
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "a nil function is refused")
}
