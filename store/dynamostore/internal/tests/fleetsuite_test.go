package tests

import (
	"testing"

	"github.com/outboxkit/outbox/outboxtest/fleet"
)

// TestFleet runs the fleet suite against the DynamoDB API server.
func TestFleet(t *testing.T) {
	t.Parallel()
	fleet.Run(t, harness())
}
