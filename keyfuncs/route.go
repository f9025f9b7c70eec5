package keyfuncs

import (
	"fmt"
	"net/http"
)

// Pattern keys a request by the [http.ServeMux] pattern that matched it:
// "route:<pattern>", hashed as [User] hashes ids. The pattern is set once a
// ServeMux has routed the request, so the limiter must wrap the handler
// registered in the mux, not the mux; an empty pattern is an error wrapping
// [ErrNoKey].
func Pattern(r *http.Request) (string, error) {
	return subjectKey("route:", r.Pattern, errNoPattern)
}

var errNoPattern = fmt.Errorf("keyfuncs: %w: no ServeMux pattern (Request.Pattern is empty)", ErrNoKey)

// Route keys a request by the route pattern fn reads, for other routers, as
// [Pattern] does. With chi, fn returns
// chi.RouteContext(r.Context()).RoutePattern() and the limiter runs as route
// middleware (r.With, or r.Use in r.Group): under r.Use of a Mux or r.Route
// it would read the pattern matched so far, shared by every route below. fn
// returning "" is an error wrapping [ErrNoKey]; a nil fn is an error
// wrapping [ErrInvalidConfig].
func Route(fn func(r *http.Request) string) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("Route function is nil")
	}
	return func(r *http.Request) (string, error) {
		return subjectKey("route:", fn(r), errNoRoute)
	}, nil
}

var errNoRoute = fmt.Errorf("keyfuncs: %w: the Route function returned no pattern", ErrNoKey)
