package rabbitmqtransport

import (
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/outboxkit/outbox"
	"github.com/outboxkit/outbox/driver"
)

// What Publish reports for a message the broker did not confirm: a nack, no confirm
// in time, or a closed channel.

var errNacked = errors.New("rabbitmqtransport: the broker refused the message (basic.nack): a queue may be full with x-overflow=reject-publish, or the broker hit an internal error")

func errNoConfirm(d time.Duration) error {
	return fmt.Errorf("rabbitmqtransport: no publisher confirm within Config.ConfirmTimeout (%s); the broker may still have the message", d)
}

// classify turns a channel or connection failure into the error reported for an
// unconfirmed envelope: the one place broker errors are translated.
func (t *Transport) classify(env *driver.Envelope, exchange string, closed *amqp.Error, publishErr error) error {
	if closed == nil {
		if publishErr == nil {
			publishErr = amqp.ErrClosed
		}
		return fmt.Errorf("rabbitmqtransport: publish to exchange %q: %w", exchange, publishErr)
	}
	wrapped := fmt.Errorf("rabbitmqtransport: publish to exchange %q: channel closed: %w", exchange, closed)
	names := strings.Contains(closed.Reason, "exchange '"+exchange+"'")
	switch {
	case closed.Code == amqp.NotFound && names:
		if t.cfg.MissingExchangeTransient {
			return fmt.Errorf("%w (declare the exchange)", wrapped)
		}
		return driver.Permanent(fmt.Errorf("%w: declare exchange %q before publishing, or change Config.Route (Config.MissingExchangeTransient retries instead)", wrapped, exchange))
	case closed.Code == amqp.AccessRefused && names:
		return driver.Permanent(fmt.Errorf("%w: grant the user write permission on exchange %q", wrapped, exchange))
	case closed.Code == amqp.PreconditionFailed && strings.Contains(closed.Reason, fmt.Sprintf("message size %d is larger", len(env.Payload))):
		return driver.Permanent(fmt.Errorf("%w: %w: lower Config.MaxMessageSize to the broker's max_message_size", outbox.ErrTooLarge, wrapped))
	}
	return wrapped
}
