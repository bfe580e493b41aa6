// Package middleware routes an application's sends and stamps them on the way: a
// topic [Router], [Middleware] and [Chain] over [outbox.Sender], correlation-id
// stamping ([CorrelationID]), an [HTTP] middleware that carries an incoming request's
// X-Request-ID to the messages its handler sends, and [Inline] for routes that
// publish without the outbox.
//
// Trace context lives in its own package,
// [github.com/outboxkit/outbox/middleware/tracecontext], so that an application that
// does not use OpenTelemetry does not compile it: its Stamp middleware goes on a
// route like any other, and its HTTP middleware replaces this package's.
//
// A route ends at a terminal Sender, usually the capture that [outbox.NewSender]
// returns:
//
//	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
//	router := middleware.NewRouter(middleware.CorrelationID())
//	router.Handle("orders", sender)
//	router.Handle("metrics", middleware.Inline(transport))
//
//	err = store.Transact(ctx, func(ctx context.Context) error {
//		return router.Send(ctx, outbox.Message{Topic: "orders", Key: key, Payload: body})
//	})
//
// The router is itself an [outbox.Sender], so handlers depend on Sender alone and a
// route moves between the outbox and an inline transport without touching them.
//
// # Semantics
//
//   - A send runs the router's shared middleware, then the route's own, outermost
//     first, then the terminal. Stamping happens before the capture, so the stored
//     envelope carries the headers of the business operation, not of the relay.
//   - What is written, and when, is the terminal's business: the capture stages the
//     message in the unit of work on the ctx (whatever its mode), or, outside one,
//     fails with [outbox.ErrNoTransaction] ([outbox.Transactional]) or writes at once
//     ([outbox.Immediate]). A route that may send outside a unit of work ends at a
//     second sender on the same store, built with SenderConfig{Mode: outbox.Immediate}.
//   - The terminal's error comes back through the route as the terminal returned it.
//     A topic with no route fails with an error wrapping [ErrNoRoute].
//   - [CorrelationID] keeps an [outbox.HeaderCorrelationID] header the application
//     set; otherwise it stamps the id on the ctx ([WithCorrelationID], or the
//     X-Request-ID header through [HTTP]), otherwise a new random id.
//   - [HTTP] takes X-Request-ID as the correlation id, on the request's ctx; a
//     request without it is passed on unchanged, so [CorrelationID] stamps a new id
//     per message. HTTP opens no unit of work: the handler does, with the store's
//     Transact.
//   - Middleware never writes into the caller's header slice: a header is added to a
//     copy.
//   - The idempotency-key header is not stamped here: the Kafka and SQS transports
//     stamp it when they publish (their OmitIdempotencyKey turns it off), relayed and
//     [Inline] messages alike.
//   - Handle panics on an empty topic, a nil terminal or a topic registered twice,
//     Chain on a nil terminal, Inline on a nil transport and HTTP on a nil handler:
//     each is a programming error found at start-up.
//
// # Limitations
//
//   - Sends are fire-and-forget: there is no reply to wait for.
//   - Neither the middleware nor the capture copies the message's key, payload or
//     header values. Do not change them after Send returns: a staged message is read
//     again when its unit of work commits.
//   - An [Inline] route publishes synchronously, once, with no retry and no
//     durability: it is the dual write the outbox exists to replace, kept for sends
//     that do not need it.
//   - [HTTP] reads only X-Request-ID for the correlation id; a service that uses
//     another header sets the id itself with [WithCorrelationID].
package middleware
