package middleware

import (
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderRequestID is the incoming HTTP header [HTTP] takes a correlation id from.
const HeaderRequestID = "X-Request-ID"

// HTTP returns HTTP middleware that carries an incoming request's context to the
// messages its handler sends: it extracts the trace context from the request headers
// through p (for W3C, traceparent and tracestate), so [TraceContext] stamps the
// caller's trace on each message, and takes the X-Request-ID header as the
// correlation id that [CorrelationID] stamps. A nil p uses the global propagator,
// looked up on each request; install one with otel.SetTextMapPropagator (for W3C:
// propagation.TraceContext{}).
func HTTP(p propagation.TextMapPropagator) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			prop := p
			if prop == nil {
				prop = otel.GetTextMapPropagator()
			}
			ctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			if id := r.Header.Get(HeaderRequestID); id != "" {
				ctx = WithCorrelationID(ctx, id)
			}
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
}
