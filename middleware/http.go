package middleware

import (
	"net/http"

	"github.com/outboxkit/outbox"
)

// ScopeHandler opens an [outbox.Scope] for each request, puts it on the request's
// context and releases it when next returns (a panic included). Transactional sends
// made while serving the request stage on that scope; the handler commits them through
// a store's unit of work. Envelopes still staged at release were never committed: the
// scope discards them and reports them (see [outbox.Scope.Release]).
func ScopeHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, scope := outbox.NewScope(r.Context())
		defer scope.Release()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
