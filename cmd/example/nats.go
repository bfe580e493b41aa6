package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/transport/natstransport"
)

// natsBroker publishes through transport/natstransport to a JetStream stream of its own, and
// reads it back with a consumer.
//
// The stream is created for the walkthrough and deleted at Close: a memory stream
// whose subjects are the topic under a random prefix, so no stream of the server's is
// touched. Its duplicate window is JetStream's shortest, 100 ms, so that story 2's
// redelivery shows: within a stream's window (2 minutes by default) JetStream would
// drop the relay's second copy, since it carries the same Nats-Msg-Id. Received waits
// longer than the window before it reports the stream drained, and story 2 reads the
// broker between the two publishes, so the second copy always lands outside it.
type natsBroker struct {
	*natstransport.Transport
	url      string
	nc       *nats.Conn
	js       jetstream.JetStream
	stream   string
	cons     jetstream.Consumer
	received []delivery
}

// natsDrained is how long Received waits for a message before it reports the stream
// drained; it exceeds the stream's duplicate window.
const natsDrained = 300 * time.Millisecond

func openNATS(ctx context.Context, url string) (_ *natsBroker, err error) {
	b := &natsBroker{url: url, stream: "outbox-example-" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")}
	defer func() {
		if err != nil {
			_ = b.Close()
		}
	}()
	if b.nc, err = nats.Connect(url, nats.Timeout(5*time.Second)); err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	stream, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
		Name:       b.stream,
		Subjects:   []string{b.stream + ".>"},
		Storage:    jetstream.MemoryStorage,
		Duplicates: 100 * time.Millisecond,
	})
	if err != nil {
		return nil, fmt.Errorf("nats: create stream %s (is JetStream enabled, nats-server -js?): %w", b.stream, err)
	}
	if b.cons, err = stream.CreateConsumer(ctx, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy}); err != nil {
		return nil, fmt.Errorf("nats: create consumer: %w", err)
	}
	prefix := b.stream + "."
	b.Transport, err = natstransport.New(b.js, natstransport.Config{
		Subject: func(topic string) string { return prefix + topic },
	})
	if err != nil {
		return nil, err
	}
	return b, nil
}

func (b *natsBroker) Name() string {
	return fmt.Sprintf("NATS JetStream stream %s at %s (duplicate window 100 ms, so the redelivery shows)", b.stream, b.url)
}

// Received reads the stream until no message comes for natsDrained and returns every
// message read since the broker was opened.
func (b *natsBroker) Received(context.Context) ([]delivery, error) {
	for {
		batch, err := b.cons.Fetch(100, jetstream.FetchMaxWait(natsDrained))
		if err != nil {
			return nil, fmt.Errorf("nats: fetch: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			d, err := natstransport.Decode(msg)
			if err != nil {
				return nil, err
			}
			idempotencyKey, _ := d.Header(outbox.HeaderIdempotencyKey)
			b.received = append(b.received, delivery{
				Topic: d.Topic, Key: d.Key, Payload: d.Payload,
				ID: d.ID.String(), IdempotencyKey: string(idempotencyKey),
			})
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("nats: fetch: %w", err)
		}
		if n == 0 {
			return slices.Clone(b.received), nil
		}
	}
}

func (b *natsBroker) Close() error {
	if b.nc == nil {
		return nil
	}
	if b.js != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.js.DeleteStream(ctx, b.stream)
	}
	b.nc.Close()
	return nil
}
