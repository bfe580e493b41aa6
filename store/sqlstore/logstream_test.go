package sqlstore

import (
	"slices"
	"testing"
	"time"
)

// A batch handed out after waiting in vain halves the next wait, down to the floor;
// the first batch of several transactions restores the full wait.
func TestStreamLingerAdapts(t *testing.T) {
	st := &logStream{linger: streamLinger}
	var got []time.Duration
	for _, txns := range []int{1, 1, 1, 1, 1, 1, 2, 1} {
		st.txns = txns
		st.adapt()
		got = append(got, st.linger)
	}
	want := []time.Duration{250 * time.Microsecond, 125 * time.Microsecond, 62500 * time.Nanosecond,
		streamLingerMin, streamLingerMin, streamLingerMin, streamLinger, 250 * time.Microsecond}
	if !slices.Equal(got, want) {
		t.Fatalf("lingers %v, want %v", got, want)
	}
}
