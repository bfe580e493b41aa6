package outboxtest

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxkit/outbox/driver"
)

// Failures returns why each message a Publish call reported failed, by message ID.
// It fails tb unless err is a [*driver.PublishError].
func Failures(tb testing.TB, err error) map[uuid.UUID]error {
	tb.Helper()
	var pe *driver.PublishError
	require.ErrorAs(tb, err, &pe, "want a *driver.PublishError")
	out := make(map[uuid.UUID]error, len(pe.Failed))
	for _, f := range pe.Failed {
		out[f.ID] = f.Err
	}
	return out
}
