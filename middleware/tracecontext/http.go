package tracecontext

import (
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/outboxkit/outbox/middleware"
)

// HTTP returns HTTP middleware that carries an incoming request's context to the
// messages its handler sends. It extracts the trace context from the request headers
// through p (for W3C: traceparent and tracestate), so [Stamp] stamps the caller's
// trace on each message, and then does what [middleware.HTTP] does: the X-Request-ID
// header becomes the correlation id that [middleware.CorrelationID] stamps. Wrap a
// handler in this one alone, not in both.
//
// A nil p uses the global propagator, looked up on each request; install one with
// otel.SetTextMapPropagator (for W3C: propagation.TraceContext{}). The returned
// function panics on a nil handler, as middleware.HTTP does.
func HTTP(p propagation.TextMapPropagator) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		withRequestID := middleware.HTTP(next)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			prop := p
			if prop == nil {
				prop = otel.GetTextMapPropagator()
			}
			ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			withRequestID.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}
