// Package middleware is the capture side of the outbox: the [Sender] an application
// calls, [Middleware] that wraps it, a topic [Router], the [Outbox] capture that turns a
// send into a stored envelope, header stamping (trace context, correlation id) and an
// HTTP middleware that opens an [outbox.Scope] per request.
//
// A typical route stamps headers, then captures:
//
//	ob, err := middleware.NewOutbox(store, middleware.Config{})
//	router := middleware.NewRouter()
//	router.Handle("orders", nil,
//		middleware.TraceContext(nil), middleware.CorrelationID(), ob.UseOutbox())
//	err = router.Send(ctx, outbox.Message{Topic: "orders", Key: key, Payload: body})
//
// Routes without [Outbox.UseOutbox] send inline through a transport ([Inline]); the
// call site is the same either way.
//
// # Semantics
//
//   - Capture short-circuits its route: the middleware and terminal after
//     [Outbox.UseOutbox] are never called. Put stamping middleware before it so the
//     stored envelope carries the headers.
//   - [outbox.Immediate] (the default) writes the envelope with [outbox.Store.Enqueue]
//     before Send returns: durable, but not atomic with the application's own write.
//   - [outbox.Transactional] stages the envelope on the context's [outbox.Scope]; a
//     store's unit of work writes it in the application's transaction. Without a scope
//     Send fails with [outbox.ErrNoScope]; nothing is silently dropped.
//   - Every captured message carries an idempotency-key header equal to its message
//     id, unless the application set one or [Config.DisableIdempotencyKey] is set.
//   - Middleware never changes the caller's header slice: a header is added to a copy.
//   - A message larger than [Config.MaxMessageSize] or the store's
//     [outbox.SizeLimiter] limit fails with [outbox.ErrTooLarge] and nothing is written.
//
// # Limitations
//
//   - Captured sends are fire-and-forget: there is no reply to wait for.
//   - Capture does not copy the message's key, payload or header values. Do not change
//     them after Send returns (in Transactional mode they are read again at commit).
//   - An [Inline] route publishes synchronously with no retry and no durability: it is
//     what the outbox exists to replace, kept for sends that do not need it.
package middleware
