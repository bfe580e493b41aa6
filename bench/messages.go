package main

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
)

const (
	payloadSize = 1024
	keyCount    = 100
)

// A plan says which message ids a run sent. Writer w of W sends ids w, w+W, w+2W, …
// and owns the keys k with k%W == w, so every key is written by one writer in id
// order: a key's ids must reach Kafka in increasing order.
type plan struct {
	writers int
	counts  []atomic.Int64 // messages taken by each writer (read by the consumer meanwhile)
	seed    uint64
}

func newPlan(writers int) *plan {
	return &plan{writers: writers, counts: make([]atomic.Int64, writers), seed: rand.Uint64()}
}

// id is writer w's k-th message id.
func (p *plan) id(w, k int) uint64 { return uint64(k*p.writers + w) }

func (p *plan) sent(id uint64) bool {
	w, k := int(id%uint64(p.writers)), int(id/uint64(p.writers))
	return int64(k) < p.counts[w].Load()
}

func (p *plan) total() int {
	n := 0
	for i := range p.counts {
		n += int(p.counts[i].Load())
	}
	return n
}

// keySlot is the key (0..99) of message id: one of its writer's keys, in turn.
func (p *plan) keySlot(id uint64) int {
	w, k := int(id%uint64(p.writers)), int(id/uint64(p.writers))
	owned := (keyCount - w + p.writers - 1) / p.writers
	return w + p.writers*(k%owned)
}

func (p *plan) key(id uint64) []byte { return fmt.Appendf(nil, "key-%02d", p.keySlot(id)) }

// payload is message id's 1 KiB: the id, then bytes drawn from a generator seeded
// with the run's seed and the id, so the consumer can rebuild and compare it.
func (p *plan) payload(id uint64) []byte {
	b := make([]byte, payloadSize)
	p.fillPayload(b, id)
	return b
}

func (p *plan) fillPayload(b []byte, id uint64) {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[0:], p.seed)
	binary.LittleEndian.PutUint64(seed[8:], id)
	_, _ = rand.NewChaCha8(seed).Read(b[8:])
	binary.BigEndian.PutUint64(b[:8], id)
}

// payloadID reads the id back from a payload.
func payloadID(b []byte) (uint64, bool) {
	if len(b) != payloadSize {
		return 0, false
	}
	return binary.BigEndian.Uint64(b[:8]), true
}

// message is one message a writer sends.
type message struct {
	id      uint64
	key     []byte
	payload []byte
}

// next takes writer w's next n messages.
func (p *plan) next(w, n int) []message {
	msgs := make([]message, n)
	for i := range msgs {
		id := p.id(w, int(p.counts[w].Add(1)-1))
		msgs[i] = message{id: id, key: p.key(id), payload: p.payload(id)}
	}
	return msgs
}
