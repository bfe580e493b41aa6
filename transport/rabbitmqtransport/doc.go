// Package rabbitmqtransport is the outbox transport for RabbitMQ (and any AMQP 0-9-1 broker),
// built on github.com/rabbitmq/amqp091-go.
//
// The caller writes a [Dialer] (URL, credentials, TLS, heartbeat: every connection
// setting stays the caller's) and passes it to [New]; New never dials. The transport
// dials on its first publish or ping, and again whenever the connection broke. A
// consumer turns deliveries back into messages with [Decode], or hands a [Source] to
// an inbox.Consumer (github.com/outboxkit/outbox/inbox), which applies each
// delivery's effects once and acknowledges it after the unit of work committed.
//
//	dial := func(ctx context.Context) (*amqp.Connection, error) {
//		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
//	}
//	transport, err := rabbitmqtransport.New(dial, rabbitmqtransport.Config{})
//	defer transport.Close()
//	sender, err := outbox.NewSender(store, outbox.SenderConfig{Transport: transport})
//
// # Semantics
//
//   - Routing: [Config.Route] maps each envelope to an exchange and a routing key;
//     [DefaultRoute] publishes to the exchange named by the topic with the key as
//     routing key. The exchanges, queues and bindings are the application's to
//     declare; the transport declares nothing.
//   - Every message is published persistent (delivery mode 2) with the mandatory
//     flag, on a channel in confirm mode. [Transport.Publish] sends the whole batch
//     and then waits once for the broker's confirms (deferred confirmations). It
//     returns nil only when every message was confirmed and none was returned
//     unroutable. A confirm means the broker took responsibility for the message: for
//     a durable queue, that it was written to disk (classic queues) or to a quorum of
//     replicas (quorum queues).
//   - Permanent failures ([driver.Permanent]; the relay parks the message): a
//     message that no queue is bound to receive (basic.return, 312 NO_ROUTE; it also
//     wraps [outbox.ErrInvalidMessage]), an exchange that does not exist (unless
//     [Config.MissingExchangeTransient]), write access refused on the exchange, a
//     message over [Config.MaxMessageSize] or the broker's max_message_size, or whose
//     key and headers do not fit one frame (wrapping [outbox.ErrTooLarge]), an
//     exchange name, routing key or header name over 255 bytes, and an application
//     header named like one the transport writes. Transient: a broker nack (a full
//     queue with x-overflow=reject-publish, an internal error), a broken connection,
//     a missing confirm within [Config.ConfirmTimeout], and every message the channel
//     could not carry after another message closed it.
//   - Headers: the message id is the AMQP message-id property and an
//     [outbox.HeaderMessageID] header; an [outbox.HeaderIdempotencyKey] header equal
//     to the id is added when the application set none, unless
//     [Config.OmitIdempotencyKey]. The application's headers are entries of the AMQP
//     header table (long strings, byte for byte). A table is a map, so the transport
//     also writes [HeaderOrder], the names in order, and a name that occurs more than
//     once holds an array of its values; [Decode] restores order and duplicates. The
//     key travels in [HeaderKey] (absent for a keyless message), a nil payload is
//     marked by [HeaderTombstone], and the topic is written as [HeaderTopic] when the
//     route's exchange is not the topic.
//   - Reconnection: a Publish or Ping that finds the connection closed dials again.
//     A Publish that cannot dial returns the dial error (not a PublishError: nothing
//     was sent), and the relay retries the batch. The transport implements
//     [driver.Pinger] with a passive declare of amq.direct, so a relay cut off from
//     its broker steps aside instead of parking messages.
//   - Concurrency: each Publish call takes a channel of its own from a pool, so calls
//     run in parallel over one connection.
//
// # Limitations
//
//   - Delivery is at least once. A batch whose confirms were lost with the
//     connection, or that outlived [Config.ConfirmTimeout] or ctx, is published
//     again; consumers deduplicate on the message id.
//   - Per-key order holds for a key whose messages reach one queue, consumed by one
//     consumer that acknowledges in order (or with a prefetch of 1 when it may
//     reject): one relay publishes a bucket at a time, a Publish call waits for its
//     confirms before the next, and RabbitMQ keeps a channel's publishes in order
//     into a queue. Within one call the broker may confirm a key's later message
//     after refusing an earlier one, so the transport does not implement
//     [driver.KeyOrderKeeper]: the relay puts at most one message of a key in a
//     call, and a key's messages go out one confirm round trip apart. Order across
//     queues (a consistent-hash exchange rebalanced, several consumers on one queue,
//     a requeue after a consumer's nack) is not kept.
//   - Message.Partition is ignored: AMQP has no partitions.
//   - AMQP timestamps have second precision.
//   - The client's socket writes and channel opens take no context: while a broker
//     blocks publishers (a memory or disk alarm, connection.blocked) or the network
//     drops packets without resetting the connection, a Publish can wait until the
//     heartbeat notices the dead connection (amqp.Config.Heartbeat, 10 s by default)
//     despite ctx. Set a heartbeat that suits the relay's LeaseDuration.
//   - The client's own recovery (amqp.Config.Recovery) must stay off: a connection
//     with it is refused with [outbox.ErrMisconfigured].
package rabbitmqtransport
