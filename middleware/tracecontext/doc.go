// Package tracecontext carries OpenTelemetry trace context through the outbox: [Stamp]
// is route middleware that writes the send's trace context into the message headers
// (for W3C: traceparent and tracestate), and [HTTP] is HTTP middleware that extracts
// an incoming request's trace context onto its context, so the messages a handler
// sends carry the caller's trace across the hop to the consumer.
//
// It is a package of its own so that an application that does not use OpenTelemetry
// routes and stamps correlation ids with package middleware alone and never compiles
// the OpenTelemetry API.
//
// Set-up, once at start-up:
//
//	otel.SetTextMapPropagator(propagation.TraceContext{}) // W3C trace context
//
//	sender, err := outbox.NewSender(store, outbox.SenderConfig{})
//	router := middleware.NewRouter(tracecontext.Stamp(nil), middleware.CorrelationID())
//	router.Handle("orders", sender)
//
//	http.ListenAndServe(addr, tracecontext.HTTP(nil)(mux))
//
// # Semantics
//
//   - [Stamp] writes what its propagator injects from the send's context, replacing
//     headers of the same name, and leaves the others in place. It never writes into
//     the caller's header slice: the first header it sets is set on a copy. The next
//     Sender's error comes back unchanged.
//   - [HTTP] extracts the trace context from the request's headers onto the request's
//     context, then does what [middleware.HTTP] does: the X-Request-ID header becomes
//     the correlation id that [middleware.CorrelationID] stamps. One wrapper does
//     both, so it replaces middleware.HTTP rather than joining it.
//   - A nil propagator means the global one (otel.GetTextMapPropagator), looked up at
//     each send and each request, so a propagator installed after the routes and
//     handlers were built still counts, and one otel.SetTextMapPropagator call
//     configures both. Until one is installed the global propagator does nothing:
//     Stamp writes no header and HTTP extracts no trace context.
//   - With no span context on the send's context, Stamp writes nothing (for W3C).
//   - No OpenTelemetry SDK is needed: without one, the message carries the caller's
//     trace id and span id as received. A handler that starts a span from the
//     request's context and sends with the span's context stamps that span instead.
//
// # Limitations
//
//   - Only what the propagator carries is stamped: to carry baggage as well, install
//     propagation.NewCompositeTextMapPropagator(propagation.TraceContext{},
//     propagation.Baggage{}).
//   - Neither middleware starts a span; an application that wants a span per send or
//     per request starts it itself, or uses its HTTP instrumentation.
//   - [HTTP] opens no unit of work: the handler does, with its store's Transact.
package tracecontext
