package tests

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/outboxtest"
	"github.com/outboxkit/outbox/relay"
	"github.com/outboxkit/outbox/store/dynamostore"
)

// relay.New refuses a relay id the table's sort key cannot hold, before anything
// runs (it used to fail only at the first heartbeat, after Start).
func TestRelayIDTooLongForTheTableFailsAtNew(t *testing.T) {
	db := newTestDB(t)
	s := db.newStore(t, dynamostore.Config{})
	_, err := relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: strings.Repeat("r", 1100)})
	require.ErrorIs(t, err, outbox.ErrMisconfigured)
	require.ErrorContains(t, err, "RelayID")
	require.ErrorContains(t, err, "1100 bytes")
	_, err = relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: "\xff"})
	require.ErrorIs(t, err, outbox.ErrMisconfigured, "not UTF-8")
	_, err = relay.New(s, outboxtest.NewRecorder(), relay.Config{RelayID: strings.Repeat("r", 1000)})
	require.NoError(t, err)
}
