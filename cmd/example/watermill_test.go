package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestWalkthroughOnWatermill runs the -watermill-amqp path against the local broker,
// on a queue of its own.
func TestWalkthroughOnWatermill(t *testing.T) {
	t.Parallel()
	text := checkStory(t, options{Watermill: amqpURL(t)})
	assert.Contains(t, text, "messages go to Watermill's AMQP publisher, queue "+topic+".")
}
