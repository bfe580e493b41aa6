// Package tests holds the outboxotel tests that need other modules of the
// repository (the trace-context middleware), so that an application importing
// outboxotel does not load them.
package tests
