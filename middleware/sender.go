package middleware

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/outboxkit/outbox"
)

// ErrNoRoute: a [Router] has no route for the message's topic.
var ErrNoRoute = errors.New("middleware: no route for topic")

// Middleware wraps a Sender with behaviour of its own. It may change the message (on a
// copy), call next, or answer without calling next (as capture does).
type Middleware func(next outbox.Sender) outbox.Sender

// Chain wraps terminal in mws. The first middleware is the outermost: it sees a send
// first. Chain panics on a nil terminal: a route that ends nowhere is a programming
// error found at start-up.
func Chain(terminal outbox.Sender, mws ...Middleware) outbox.Sender {
	if terminal == nil {
		panic("middleware: Chain with a nil terminal: end the route with the outbox.Sender from outbox.NewSender, or an Inline transport")
	}
	s := terminal
	for i := len(mws) - 1; i >= 0; i-- {
		s = mws[i](s)
	}
	return s
}

// Router sends each message through the route registered for its topic. It is itself
// an [outbox.Sender], so handlers depend on Sender alone. Register routes before the first send;
// Handle and Send are safe for concurrent use.
type Router struct {
	shared []Middleware
	mu     sync.RWMutex
	routes map[string]outbox.Sender
}

// NewRouter returns a router whose routes all start with the shared middleware, outermost
// first, followed by each route's own.
func NewRouter(shared ...Middleware) *Router {
	return &Router{shared: shared, routes: make(map[string]outbox.Sender)}
}

// Handle registers the route for topic: the router's shared middleware, then mws, then
// terminal — usually the outbox's capture ([outbox.NewSender]), or [Inline] for a
// route that needs no outbox. Handle panics on an empty topic, a nil terminal or a
// topic registered twice, like http.ServeMux: all are programming errors found at
// start-up.
func (r *Router) Handle(topic string, terminal outbox.Sender, mws ...Middleware) {
	if topic == "" {
		panic("middleware: Router.Handle with an empty topic")
	}
	all := make([]Middleware, 0, len(r.shared)+len(mws))
	all = append(append(all, r.shared...), mws...)
	s := Chain(terminal, all...)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.routes[topic]; dup {
		panic(fmt.Sprintf("middleware: Router.Handle: topic %q is already registered", topic))
	}
	r.routes[topic] = s
}

// Send sends msg through its topic's route. A topic with no route fails with an error
// wrapping [ErrNoRoute].
func (r *Router) Send(ctx context.Context, msg outbox.Message) error {
	r.mu.RLock()
	s, ok := r.routes[msg.Topic]
	r.mu.RUnlock()
	if !ok {
		return fmt.Errorf("%w %q: register a route for it with Router.Handle before sending", ErrNoRoute, msg.Topic)
	}
	return s.Send(ctx, msg)
}

// Topics returns the registered topics, sorted.
func (r *Router) Topics() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.routes))
}
