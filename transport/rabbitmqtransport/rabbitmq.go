package rabbitmqtransport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// DefaultMaxMessageSize is the default [Config.MaxMessageSize]: 16 MiB, RabbitMQ 4's
// default max_message_size (RabbitMQ 3.x allowed 128 MiB).
const DefaultMaxMessageSize = 16 << 20

// DefaultConfirmTimeout is the default [Config.ConfirmTimeout].
const DefaultConfirmTimeout = 10 * time.Second

// maxShortString is AMQP's limit on a short string: exchange names, routing keys and
// header names.
const maxShortString = 255

// Dialer opens a connection to the broker. The caller writes it (URL, credentials,
// TLS, heartbeat and dial timeout are the caller's choice) and the transport calls it
// whenever it has no open connection: on the first publish or ping, and after the
// connection broke. The transport owns each connection it gets from the dialer and
// closes it in [Transport.Close].
//
// A typical dialer:
//
//	dial := func(ctx context.Context) (*amqp.Connection, error) {
//		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
//	}
//
// The connection must not have amqp.Config.Recovery set: the transport reconnects by
// itself, and counts on a channel that closes, failing its outstanding confirms, when
// its connection breaks; the client's recovery would reopen it underneath instead.
type Dialer func(ctx context.Context) (*amqp.Connection, error)

// Route maps an envelope to the exchange and routing key it is published with.
type Route func(env *driver.Envelope) (exchange, routingKey string)

// DefaultRoute publishes to the exchange named by the topic with the message key as
// the routing key (an empty routing key for a keyless message). With a direct or
// topic exchange, queues bind by key; with a fanout exchange the key is ignored; with
// the consistent-hash exchange plugin, a key's messages always reach the same queue.
func DefaultRoute(env *driver.Envelope) (exchange, routingKey string) {
	return env.Topic, string(env.Key)
}

// Config tunes a [Transport]. The zero value is ready to use.
type Config struct {
	// Route maps each envelope to an exchange and a routing key. Both must be at most
	// 255 bytes (AMQP's short strings); a message whose route is longer fails
	// permanently, wrapping [outbox.ErrInvalidMessage]. Defaults to [DefaultRoute]:
	// the topic is the exchange and the key is the routing key, so a key of more than
	// 255 bytes needs a Route of its own.
	Route Route

	// MaxMessageSize is the largest [outbox.Message.Size] the transport publishes;
	// [Transport.MaxMessageSize] reports it, so capture refuses a larger message at
	// Send when the transport is wired in through outbox.SenderConfig.Transport. A
	// larger message fails permanently, wrapping [outbox.ErrTooLarge], without being
	// sent. Keep it at or under the broker's max_message_size. Defaults to 16 MiB
	// ([DefaultMaxMessageSize]).
	MaxMessageSize int

	// OmitIdempotencyKey stops the transport from adding an [outbox.HeaderIdempotencyKey]
	// header (set to the message id) to messages captured without one. Defaults to
	// false: every message carries the header.
	OmitIdempotencyKey bool

	// ConfirmTimeout bounds how long Publish waits for the broker's publisher
	// confirms. When it passes, every unconfirmed message of the batch is reported
	// failed, transient, and the channel is abandoned (closed in the background); the
	// broker may still have routed those messages, so the retry can be a duplicate.
	// Keep it well under the relay's LeaseDuration. Defaults to 10 s; a negative
	// value waits until ctx ends.
	ConfirmTimeout time.Duration

	// MissingExchangeTransient reports a publish to an exchange that does not exist
	// as a transient failure, retried with backoff, for exchanges a deployment
	// declares after the application starts. Defaults to false: the message fails
	// permanently and the relay parks it.
	MissingExchangeTransient bool

	// Logger receives reconnections. Defaults to slog.Default().
	Logger *slog.Logger
}

// Validate reports the first setting that cannot work, naming its field. Zero values
// are valid: they take their defaults.
func (c Config) Validate() error {
	return transportkit.Positive("rabbitmqtransport", "Config.MaxMessageSize", c.MaxMessageSize, "the default of "+strconv.Itoa(DefaultMaxMessageSize))
}

// Transport publishes outbox envelopes to RabbitMQ (or any AMQP 0-9-1 broker) with
// publisher confirms and mandatory routing. It is safe for concurrent use: each
// Publish call uses a channel of its own, taken from a small pool.
type Transport struct {
	dial Dialer
	cfg  Config
	log  *slog.Logger

	mu     sync.Mutex // guards the fields below; held while dialing
	conn   *amqp.Connection
	idle   []*pubChannel
	closed bool

	// wg counts background goroutines: abandoned channels being closed, pings. Close
	// waits for them.
	wg sync.WaitGroup
}

// pubChannel is one channel in confirm mode with its listeners.
type pubChannel struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
	closes  chan *amqp.Error
	// closeErr caches the channel's close reason once read from closes.
	closeErr *amqp.Error
}

// returnBuffer is the room for basic.return frames while a Publish waits. The wait
// keeps reading them, so a fuller buffer only slows the connection's reader briefly.
const returnBuffer = 256

// New returns a transport that publishes over connections dial opens. New does not
// dial: the first [Transport.Publish] or [Transport.Ping] does. It returns an error
// wrapping [outbox.ErrMisconfigured] when dial is nil or cfg is invalid.
//
// Why a dialer rather than a connection: an amqp091 connection that broke cannot be
// reopened, so a transport handed one connection could never publish again after a
// network failure. The dialer keeps every connection setting in the caller's hands
// while letting the transport reconnect.
func New(dial Dialer, cfg Config) (*Transport, error) {
	if err := transportkit.CheckArgs(dial == nil, "rabbitmqtransport: dial is nil: pass a func that calls amqp.DialConfig with your URL", cfg); err != nil {
		return nil, err
	}
	if cfg.Route == nil {
		cfg.Route = DefaultRoute
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = DefaultMaxMessageSize
	}
	if cfg.ConfirmTimeout == 0 {
		cfg.ConfirmTimeout = DefaultConfirmTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Transport{dial: dial, cfg: cfg, log: log}, nil
}

// MaxMessageSize implements [driver.SizeLimiter]: [Config.MaxMessageSize], or its
// default.
func (t *Transport) MaxMessageSize() int { return t.cfg.MaxMessageSize }

// As reaches the current connection: target must be a **amqp.Connection. It reports
// false when the transport holds no open connection.
func (t *Transport) As(target any) bool {
	p, ok := target.(**amqp.Connection)
	if !ok {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == nil || t.conn.IsClosed() {
		return false
	}
	*p = t.conn
	return true
}

// Close closes the transport's connection and waits for its background work. Later
// calls to Publish and Ping return an error wrapping [outbox.ErrClosed]. Closing twice
// is a no-op.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	conn := t.conn
	t.conn, t.idle = nil, nil
	t.mu.Unlock()
	var err error
	if conn != nil && !conn.IsClosed() {
		if cerr := conn.CloseDeadline(time.Now().Add(5 * time.Second)); cerr != nil && !errors.Is(cerr, amqp.ErrClosed) {
			err = fmt.Errorf("rabbitmqtransport: close connection: %w", cerr)
		}
	}
	t.wg.Wait()
	return err
}

var errClosed = fmt.Errorf("%w: rabbitmqtransport: the transport was closed", outbox.ErrClosed)

// acquire returns a channel in confirm mode for one caller's exclusive use, dialing
// when the transport has no open connection.
func (t *Transport) acquire(ctx context.Context) (*pubChannel, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errClosed
	}
	if t.conn == nil || t.conn.IsClosed() {
		lost := t.conn != nil
		t.conn, t.idle = nil, nil
		conn, err := t.dial(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("rabbitmqtransport: dial: %w", err)
		}
		if conn == nil {
			return nil, fmt.Errorf("%w: rabbitmqtransport: dial returned no connection and no error", outbox.ErrMisconfigured)
		}
		if conn.IsRecoveryEnabled() {
			_ = conn.Close()
			return nil, fmt.Errorf("%w: rabbitmqtransport: dial returned a connection with amqp.Config.Recovery set: leave Recovery nil, the transport reconnects by itself", outbox.ErrMisconfigured)
		}
		if lost {
			t.log.Info("rabbitmqtransport: reconnected after the connection broke")
		}
		t.conn = conn
	}
	for len(t.idle) > 0 {
		pc := t.idle[len(t.idle)-1]
		t.idle = t.idle[:len(t.idle)-1]
		if pc.conn == t.conn && !pc.ch.IsClosed() {
			return pc, nil
		}
	}
	ch, err := t.conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmqtransport: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("rabbitmqtransport: put channel in confirm mode: %w", err)
	}
	return &pubChannel{
		conn:    t.conn,
		ch:      ch,
		returns: ch.NotifyReturn(make(chan amqp.Return, returnBuffer)),
		closes:  ch.NotifyClose(make(chan *amqp.Error, 1)),
	}, nil
}

// release gives a healthy channel back to the pool.
func (t *Transport) release(pc *pubChannel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || pc.conn != t.conn || pc.ch.IsClosed() {
		return
	}
	t.idle = append(t.idle, pc)
}

// abandon closes a channel whose confirms are still outstanding, in the background:
// closing is a round trip the caller should not wait for, and the broker's late
// returns must be read meanwhile so the connection's reader never blocks.
func (t *Transport) abandon(pc *pubChannel) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return // Close closed the connection, and every channel with it.
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			for range pc.returns { //nolint:revive // draining until the channel shuts down
			}
		}()
		_ = pc.ch.Close()
		<-drained
	}()
}

// Ping implements [driver.Pinger]: it dials if the transport has no connection, and
// asks the broker for the amq.direct exchange every virtual host has (a passive
// declare: one round trip, nothing published). It returns nil when the broker
// answers, and ctx's error once ctx has ended.
func (t *Transport) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pc, err := t.acquire(ctx)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errClosed
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		done <- pc.ch.ExchangeDeclarePassive("amq.direct", amqp.ExchangeDirect, true, false, false, false, nil)
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("rabbitmqtransport: ping: %w", err)
		}
		t.release(pc)
		return nil
	case <-ctx.Done():
		t.abandon(pc)
		return ctx.Err()
	}
}

// sent is one message handed to the channel.
type sent struct {
	index    int
	exchange string
	dc       *amqp.DeferredConfirmation // nil when the publish itself failed
	err      error                      // the publish's own error
}

// Publish publishes every envelope of the batch on one channel in confirm mode, with
// the mandatory flag, and waits once for the broker's confirms. It returns nil when
// every message was routed to at least one queue and confirmed, a
// [*driver.PublishError] naming the envelopes that were not (each cause marked
// [driver.Permanent] when retrying cannot help), ctx's error when ctx ended first, or
// another error (the broker could not be reached: nothing was sent).
func (t *Transport) Publish(ctx context.Context, batch []*driver.Envelope) error {
	return transportkit.Publish(ctx, batch, t.publish)
}

// publish sends batch for [transportkit.Publish], recording in errs why each envelope
// failed.
func (t *Transport) publish(ctx context.Context, batch []*driver.Envelope, errs []error) error {
	pc, err := t.acquire(ctx)
	if err != nil {
		return err
	}
	pubs := make([]amqp.Publishing, len(batch))
	exchanges := make([]string, len(batch))
	keys := make([]string, len(batch))
	ready := 0
	for i, env := range batch {
		exchanges[i], keys[i] = t.cfg.Route(env)
		pub, err := t.encode(env, exchanges[i], keys[i], pc.conn.Config.FrameSize)
		if err != nil {
			errs[i] = err
			continue
		}
		pubs[i] = pub
		ready++
	}
	if ready == 0 {
		t.release(pc)
		return nil
	}
	return t.send(ctx, pc, batch, pubs, exchanges, keys, errs)
}

// send publishes the encoded messages (those without an error yet) on pc, waits for
// their confirms and records each failure in errs. It returns ctx's error alone when
// ctx ended first.
func (t *Transport) send(ctx context.Context, pc *pubChannel, batch []*driver.Envelope, pubs []amqp.Publishing, exchanges, keys []string, errs []error) error {
	out := make([]sent, 0, len(batch))
	for i := range batch {
		if errs[i] != nil {
			continue
		}
		s := sent{index: i, exchange: exchanges[i]}
		s.dc, s.err = pc.ch.PublishWithDeferredConfirm(exchanges[i], keys[i], true, false, pubs[i])
		out = append(out, s)
		if s.err != nil {
			break // the channel is gone: the rest is not sent
		}
	}
	var timeout <-chan time.Time
	if t.cfg.ConfirmTimeout > 0 {
		timer := time.NewTimer(t.cfg.ConfirmTimeout)
		defer timer.Stop()
		timeout = timer.C
	}
	returned := map[string]amqp.Return{}
	returns := pc.returns
	timedOut := false
wait:
	for _, s := range out {
		if s.dc == nil {
			continue
		}
		for {
			select {
			case <-s.dc.Done():
				continue wait
			case r, ok := <-returns:
				if !ok {
					returns = nil
					continue
				}
				returned[r.MessageId] = r
			case <-ctx.Done():
				t.abandon(pc)
				return ctx.Err()
			case <-timeout:
				timedOut = true
				break wait
			}
		}
	}
	// A basic.return precedes its message's confirm, and the client hands it over
	// before it processes the confirm: every return for a confirmed message is in
	// the buffer now.
	for returns != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			returned[r.MessageId] = r
		default:
			returns = nil
		}
	}
	for _, s := range out {
		env := batch[s.index]
		if r, ok := returned[env.ID.String()]; ok {
			errs[s.index] = driver.Permanent(fmt.Errorf("%w: rabbitmqtransport: exchange %q routed the message to no queue (routing key %q; %d %s): bind a queue that matches, or change Config.Route", outbox.ErrInvalidMessage, r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText))
			continue
		}
		if s.dc != nil {
			select {
			case <-s.dc.Done():
				if s.dc.Acked() {
					continue
				}
				if !pc.ch.IsClosed() {
					errs[s.index] = errNacked
					continue
				}
			default:
				if timedOut {
					errs[s.index] = errNoConfirm(t.cfg.ConfirmTimeout)
					continue
				}
			}
		}
		errs[s.index] = t.classify(env, s.exchange, pc.reason(), s.err)
	}
	// Messages after a failed publish were never handed to the channel.
	for i := range batch {
		if errs[i] == nil && !wasSent(out, i) {
			errs[i] = t.classify(batch[i], exchanges[i], pc.reason(), nil)
		}
	}
	switch {
	case timedOut:
		t.abandon(pc)
	case pc.ch.IsClosed():
	default:
		t.release(pc)
	}
	return nil
}

func wasSent(out []sent, i int) bool {
	if len(out) == 0 {
		return false
	}
	return i <= out[len(out)-1].index
}

// reason returns the channel's close reason, if it closed with one.
func (pc *pubChannel) reason() *amqp.Error {
	if pc.closeErr != nil {
		return pc.closeErr
	}
	select {
	case e, ok := <-pc.closes:
		if ok && e != nil {
			pc.closeErr = e
		}
	default:
	}
	return pc.closeErr
}
