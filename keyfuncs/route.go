package keyfuncs

import (
	"fmt"
	"net/http"
)

// Pattern keys a request by the [http.ServeMux] pattern that matched it,
// [http.Request.Pattern]: "route:<pattern>", such as "route:GET /items/{id}".
// Patterns are bounded and hashed like the ids of [User]; keys are at most
// 70 bytes.
//
// The pattern is set only once a ServeMux has routed the request, so the
// limiter must wrap the handler registered in the mux
// (mux.Handle("GET /items/{id}", lim.Handler(h))), not the mux itself. An
// empty pattern, such as a request the limiter sees before routing, is an
// error wrapping [ErrNoKey].
func Pattern(r *http.Request) (string, error) {
	if r.Pattern == "" {
		return "", errNoPattern
	}
	return subjectKey("route:", r.Pattern), nil
}

var errNoPattern = fmt.Errorf("keyfuncs: %w: no ServeMux pattern (Request.Pattern is empty)", ErrNoKey)

// Route keys a request by a route pattern that fn reads, for routers this
// package does not import: "route:<pattern>", bounded and hashed like
// [Pattern]. With chi:
//
//	kf, err := keyfuncs.Route(func(r *http.Request) string {
//		return chi.RouteContext(r.Context()).RoutePattern()
//	})
//
// chi knows the whole pattern only once it has found the route: the limiter
// must run as route middleware (r.With(lim.Handler), or r.Use inside
// r.Group). Under r.Use of a Mux or of r.Route, it would read the pattern
// matched so far, such as "/api/*", shared by every route below.
//
// fn returning "" is an error wrapping [ErrNoKey]. A nil fn is an error
// wrapping [ErrInvalidConfig].
func Route(fn func(r *http.Request) string) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("Route function is nil")
	}
	return func(r *http.Request) (string, error) {
		p := fn(r)
		if p == "" {
			return "", errNoRoute
		}
		return subjectKey("route:", p), nil
	}, nil
}

var errNoRoute = fmt.Errorf("keyfuncs: %w: the Route function returned no pattern", ErrNoKey)
