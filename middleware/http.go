package middleware

import (
	"net/http"
)

// HeaderRequestID is the incoming HTTP header [HTTP] takes a correlation id from.
const HeaderRequestID = "X-Request-ID"

// HTTP is HTTP middleware that carries an incoming request's X-Request-ID header to
// the messages its handler sends: the header's value becomes the correlation id on the
// request's context, which [CorrelationID] stamps. A request without the header is
// passed on unchanged. HTTP opens no unit of work, and panics on a nil next.
//
// Trace context is not read here; for OpenTelemetry, the tracecontext package's HTTP
// middleware extracts it and does what HTTP does, in one wrapper.
func HTTP(next http.Handler) http.Handler {
	if next == nil {
		panic("middleware: HTTP with a nil handler")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get(HeaderRequestID); id != "" {
			r = r.WithContext(WithCorrelationID(r.Context(), id))
		}
		next.ServeHTTP(w, r)
	})
}
