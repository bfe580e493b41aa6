package rabbitmqtransport

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
	"github.com/outboxkit/outbox/internal/transportkit"
)

// Header table entries the transport writes beside the message's own headers.
const (
	// HeaderKey carries the message key (absent for a keyless message), byte for byte:
	// the routing key cannot, since it is at most 255 bytes and Config.Route may
	// drop it.
	HeaderKey = "x-outbox-key"
	// HeaderTombstone is true on a message whose payload is nil, so that a consumer
	// can tell it from an empty payload.
	HeaderTombstone = "x-outbox-tombstone"
	// HeaderOrder lists the names of the message's headers in order, a name once per
	// occurrence. An AMQP header table is a map: the list restores the order, and a
	// name that occurs more than once carries an array of its values.
	HeaderOrder = "x-outbox-header-order"
	// HeaderTopic carries the topic when Config.Route publishes to an exchange of
	// another name.
	HeaderTopic = "x-outbox-topic"
)

// reserved reports header names the transport writes itself.
func reserved(name string) bool {
	switch name {
	case HeaderKey, HeaderTombstone, HeaderOrder, HeaderTopic:
		return true
	}
	return false
}

// Sizes of AMQP framing, for the bound on a content header frame.
const (
	frameOverhead = 8  // frame type, channel, size, frame end
	headerFixed   = 14 // class, weight, body size, property flags
	// fixedProps bounds the properties other than the headers: delivery mode,
	// timestamp and the message id (a short string).
	fixedProps = 1 + 8 + 1 + 36
)

// encode builds the AMQP message for env, or the permanent failure that keeps it from
// being sent. frameMax is the connection's negotiated frame size (0: unbounded).
func (t *Transport) encode(env *driver.Envelope, exchange, routingKey string, frameMax int) (amqp.Publishing, error) {
	if err := transportkit.CheckSize("rabbitmqtransport", env, t.cfg.MaxMessageSize); err != nil {
		return amqp.Publishing{}, err
	}
	if len(exchange) > maxShortString {
		return amqp.Publishing{}, driver.Permanent(fmt.Errorf("%w: rabbitmqtransport: exchange name of %d bytes exceeds AMQP's %d: shorten the topic or set Config.Route", outbox.ErrInvalidMessage, len(exchange), maxShortString))
	}
	if len(routingKey) > maxShortString {
		return amqp.Publishing{}, driver.Permanent(fmt.Errorf("%w: rabbitmqtransport: routing key of %d bytes exceeds AMQP's %d: messages with longer keys need a Config.Route that maps them to a shorter routing key", outbox.ErrInvalidMessage, len(routingKey), maxShortString))
	}
	id := env.ID.String()
	names := make([]any, 0, len(env.Headers)+2)
	table := make(amqp.Table, len(env.Headers)+6)
	// size is the table's encoded length.
	size := 0
	add := func(name string, value []byte) {
		names = append(names, name)
		size += 5 + len(name) // the order list's entry
		switch prev := table[name].(type) {
		case nil:
			table[name] = string(value)
			size += 1 + len(name) + 1 + 4 + len(value)
		case string:
			table[name] = []any{prev, string(value)}
			size += 4 + 5 + 5 + len(value) - 4 // the array replaces the string
		case []any:
			table[name] = append(prev, string(value))
			size += 5 + len(value)
		}
	}
	for _, h := range env.Headers {
		if len(h.Key) > maxShortString {
			return amqp.Publishing{}, driver.Permanent(fmt.Errorf("%w: rabbitmqtransport: header name of %d bytes exceeds AMQP's %d", outbox.ErrInvalidMessage, len(h.Key), maxShortString))
		}
		if reserved(h.Key) {
			return amqp.Publishing{}, driver.Permanent(fmt.Errorf("%w: rabbitmqtransport: header %q is written by the transport: rename the application's header", outbox.ErrInvalidMessage, h.Key))
		}
		add(h.Key, h.Value)
	}
	if v, ok := env.Header(outbox.HeaderMessageID); !ok || string(v) != id {
		add(outbox.HeaderMessageID, []byte(id))
	}
	if !t.cfg.OmitIdempotencyKey {
		if _, ok := env.Header(outbox.HeaderIdempotencyKey); !ok {
			add(outbox.HeaderIdempotencyKey, []byte(id))
		}
	}
	table[HeaderOrder] = names
	size += 1 + len(HeaderOrder) + 1 + 4
	if env.Key != nil {
		table[HeaderKey] = string(env.Key)
		size += 1 + len(HeaderKey) + 1 + 4 + len(env.Key)
	}
	if env.Payload == nil {
		table[HeaderTombstone] = true
		size += 1 + len(HeaderTombstone) + 2
	}
	if exchange != env.Topic {
		table[HeaderTopic] = env.Topic
		size += 1 + len(HeaderTopic) + 1 + 4 + len(env.Topic)
	}
	if frame := frameOverhead + headerFixed + fixedProps + 4 + size; frameMax > 0 && frame > frameMax {
		return amqp.Publishing{}, driver.Permanent(fmt.Errorf("%w: rabbitmqtransport: the message's key and headers take %d bytes in its content header frame, more than the connection's frame size of %d (the broker's frame_max): AMQP cannot split that frame", outbox.ErrTooLarge, frame, frameMax))
	}
	return amqp.Publishing{
		Headers:      table,
		DeliveryMode: amqp.Persistent,
		MessageId:    id,
		Timestamp:    time.Now(),
		Body:         env.Payload,
	}, nil
}
