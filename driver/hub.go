package driver

import (
	"context"
	"sync"
)

// Hub fans commit notifications out to in-process subscribers. Stores embed one to
// implement [Notifier]: they call Notify after a commit, relays Subscribe. Sends
// never block the writer: each subscriber has a small buffer and a full buffer drops
// the wake-up, which is safe because the subscriber is already due to wake.
//
// The zero value is ready to use.
type Hub struct {
	mu     sync.Mutex
	subs   map[chan int]struct{}
	closed bool
}

// Subscribe returns a channel of bucket numbers. It closes when ctx ends or the hub
// closes.
func (h *Hub) Subscribe(ctx context.Context) <-chan int {
	ch := make(chan int, 64)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		close(ch)
		return ch
	}
	if h.subs == nil {
		h.subs = make(map[chan int]struct{})
	}
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if _, ok := h.subs[ch]; ok {
			delete(h.subs, ch)
			close(ch)
		}
	})
	return ch
}

// Notify announces new commits in buckets.
func (h *Hub) Notify(buckets ...int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		for _, b := range buckets {
			select {
			case ch <- b:
			default:
			}
		}
	}
}

// Close closes every subscription; later subscriptions are closed at once.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for ch := range h.subs {
		close(ch)
	}
	h.subs = nil
}
