package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestWalkthrough runs the example and checks the outcome of each story. run itself
// fails when a story turns out otherwise; the output is checked too, because it is
// what a reader of the example trusts.
func TestWalkthrough(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(t.Context(), &out), out.String())
	text := out.String()

	for _, want := range []string{
		// 1: the naive dual write loses the message.
		"Orders saved: [1001]. Messages the broker received: 0.",
		// 2: Immediate mode keeps it, and redelivers after a relay crash.
		"Orders saved: [1002]. Messages waiting in the outbox: 1.",
		"Messages the broker received: 1. Messages still in the outbox: 1.",
		"Messages the broker received: 2, with 1 distinct message id. Still in the outbox: 0.",
		"handles order 1002 once",
		// 3: commit writes both, rollback neither.
		"Orders saved: [1003]. Messages in the outbox: 1. The relay publishes 1; the broker has received 1.",
		"Orders saved: [1003]. Messages in the outbox: 0. The relay publishes 0; the broker has received 1.",
	} {
		assert.Contains(t, text, want)
	}
	assert.Equal(t, 3, strings.Count(text, "=> "), "each story ends with its conclusion")
}

func TestWalkthroughReportsAWriteError(t *testing.T) {
	err := run(t.Context(), failingWriter{})
	require.Error(t, err)
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, assert.AnError }
