package keyfuncs

import (
	"fmt"
	"net/http"
)

// Pattern keys a request by the [http.ServeMux] pattern that matched it:
// "route:<pattern>", hashed as [User] hashes ids. The mux sets the pattern
// as it routes, so the limiter must wrap a handler registered in it, not it.
func Pattern(r *http.Request) (string, error) {
	return subjectKey("route:", r.Pattern, errNoPattern)
}

var errNoPattern = fmt.Errorf("keyfuncs: %w: no ServeMux pattern (Request.Pattern is empty)", ErrNoKey)

// Route keys a request by the route pattern fn reads, for other routers, as
// [Pattern] does. With chi, fn returns
// chi.RouteContext(r.Context()).RoutePattern() and the limiter runs as route
// middleware (r.With, or r.Use in r.Group): under r.Use of a Mux or r.Route
// it would read the pattern matched so far, shared by every route below.
func Route(fn func(r *http.Request) string) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("Route function is nil")
	}
	return func(r *http.Request) (string, error) {
		return subjectKey("route:", fn(r), errNoRoute)
	}, nil
}

var errNoRoute = fmt.Errorf("keyfuncs: %w: the Route function returned no pattern", ErrNoKey)
