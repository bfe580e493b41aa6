package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	wmessage "github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Watermill's SQL forwarder, tuned: the queue schema with delete-on-ack, batches of
// the scenario's size (500 in the write scenario's verification drain) and a 10 ms
// poll. Everything else is watermill-sql's default.
const watermillPoll = 10 * time.Millisecond

// metadataKey carries the Kafka key through the forwarder's envelope.
const metadataKey = "key"

type watermillInstance struct {
	r       *run
	orders  string
	forward string // the forwarder topic, hence the table "watermill_<forward>"
}

func openWatermill(ctx context.Context, r *run) (instance, error) {
	w := &watermillInstance{r: r, orders: "bench_orders_" + r.sfx, forward: "bench_fwd_" + r.sfx}
	if err := createOrdersPG(ctx, r.env.pg, w.orders); err != nil {
		return nil, err
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(r.env.pg), w.subscriberConfig(100), watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	return w, sub.SubscribeInitialize(w.forward)
}

func (w *watermillInstance) schema(batch int) wsql.PostgreSQLQueueSchema {
	return wsql.PostgreSQLQueueSchema{SubscribeBatchSize: batch}
}

func (w *watermillInstance) subscriberConfig(batch int) wsql.SubscriberConfig {
	return wsql.SubscriberConfig{
		SchemaAdapter:  w.schema(batch),
		OffsetsAdapter: wsql.PostgreSQLQueueOffsetsAdapter{DeleteOnAck: true},
		PollInterval:   watermillPoll,
	}
}

func (w *watermillInstance) messages(ctx context.Context, msgs []message) []*wmessage.Message {
	out := make([]*wmessage.Message, len(msgs))
	for i, m := range msgs {
		wm := wmessage.NewMessage(watermill.NewUUID(), m.payload)
		wm.Metadata.Set(metadataKey, string(m.key))
		wm.SetContext(ctx)
		out[i] = wm
	}
	return out
}

// write is Watermill's documented in-transaction use: a SQL publisher built on the
// business transaction, wrapped by the forwarder's publisher.
func (w *watermillInstance) write(ctx context.Context, order int64, msgs []message) (time.Time, error) {
	err := pgx.BeginFunc(ctx, w.r.env.pg, func(tx pgx.Tx) error {
		if err := insertOrderPG(ctx, tx, w.orders, order); err != nil {
			return err
		}
		pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: w.schema(100)}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		fwd := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: w.forward})
		return fwd.Publish(w.r.topic, w.messages(ctx, msgs)...)
	})
	return time.Now(), err
}

// fill publishes the backlog through the same publishers on tx, 1,000 rows per
// INSERT.
func (w *watermillInstance) fill(ctx context.Context, tx pgx.Tx, msgs []message) (func(), error) {
	pub, err := wsql.NewPublisher(wsql.TxFromPgx(tx), wsql.PublisherConfig{SchemaAdapter: w.schema(100)}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	fwd := forwarder.NewPublisher(pub, forwarder.PublisherConfig{ForwarderTopic: w.forward})
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		if err := fwd.Publish(w.r.topic, w.messages(ctx, msgs[:n])...); err != nil {
			return nil, err
		}
		msgs = msgs[n:]
	}
	return nil, nil
}

func (w *watermillInstance) queue() string { return `"watermill_` + w.forward + `"` }

func (w *watermillInstance) close(ctx context.Context) error {
	return dropPG(ctx, w.r.env.pg, w.orders, w.queue())
}

func (w *watermillInstance) relay(ctx context.Context, batch int) (runningRelay, error) {
	pool, err := openPostgres(ctx, 2)
	if err != nil {
		return nil, err
	}
	client, err := w.r.broker.client()
	if err != nil {
		pool.Close()
		return nil, err
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromPgx(pool), w.subscriberConfig(batch), watermill.NopLogger{})
	if err != nil {
		client.Close()
		pool.Close()
		return nil, err
	}
	fwd, err := forwarder.NewForwarder(sub, kafkaPublisher{client}, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: w.forward})
	if err != nil {
		client.Close()
		pool.Close()
		return nil, err
	}
	r := &watermillRelay{fwd: fwd, sub: sub, done: make(chan error, 1), cleanup: func() { client.Close(); pool.Close() }}
	go func() { r.done <- fwd.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-fwd.Running():
	case err := <-r.done:
		r.cleanup()
		return nil, fmt.Errorf("watermill forwarder: %w", err)
	}
	return r, nil
}

type watermillRelay struct {
	fwd     *forwarder.Forwarder
	sub     *wsql.Subscriber
	done    chan error
	cleanup func()
}

func (r *watermillRelay) held() int { return -1 }

func (r *watermillRelay) stop(context.Context) error {
	err := errors.Join(r.fwd.Close(), r.sub.Close(), <-r.done)
	r.cleanup()
	return err
}

// kafkaPublisher is a Watermill publisher over franz-go: one synchronous produce per
// call, acknowledged by every in-sync replica.
type kafkaPublisher struct{ client *kgo.Client }

func (p kafkaPublisher) Publish(topic string, msgs ...*wmessage.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		recs[i] = &kgo.Record{Topic: topic, Key: []byte(m.Metadata.Get(metadataKey)), Value: m.Payload,
			Headers: []kgo.RecordHeader{{Key: "watermill-uuid", Value: []byte(m.UUID)}}}
	}
	return p.client.ProduceSync(msgs[0].Context(), recs...).FirstErr()
}

func (p kafkaPublisher) Close() error { return nil }
