// Package tollgate is net/http rate-limiting middleware whose limits are
// shared by every server of an application through Redis: one atomic Lua call
// per decision, on Redis's own clock, answering 429 Too Many Requests with
// Retry-After and the IETF RateLimit headers. An in-process store with the
// same semantics serves single servers, tests and degraded mode.
//
// This package holds only this overview. The work is done by:
//
//   - [github.com/tollgate-go/tollgate/middleware]: the Limiter (and Multi, for
//     several limits per request): key, cost, store decision within a time
//     budget, headers, then the next handler, a wait for the tokens
//     (WithDelay) or a 429; the failure policy when the store fails
//     (FailLocal by default) and a circuit breaker.
//   - [github.com/tollgate-go/tollgate/store]: the Store interface, Limit and
//     Result; the Redis store (go-redis v9, Cluster included) and the Memory
//     store.
//   - [github.com/tollgate-go/tollgate/keyfuncs]: what a request is keyed by —
//     the client's address behind trusted proxies, an API key, a user, a
//     route, or several joined.
//   - [github.com/tollgate-go/tollgate/headers]: the RateLimit and
//     RateLimit-Policy fields of draft-ietf-httpapi-ratelimit-headers, the
//     older RateLimit-* and X-RateLimit-* sets, and Retry-After.
//   - [github.com/tollgate-go/tollgate/lua]: the Redis script and its protocol,
//     for services in other languages that share the buckets.
//   - [github.com/tollgate-go/tollgate/storetest]: the conformance suite both
//     stores pass, for a store of your own.
//   - github.com/tollgate-go/tollgate/promobserver and .../otelobserver,
//     modules of their own: the Observer's events as Prometheus or
//     OpenTelemetry metrics, with bounded labels.
//   - [github.com/tollgate-go/tollgate/client]: the other side of the wire, an
//     http.RoundTripper that waits out 429s and paces requests by the
//     RateLimit fields it is sent.
//
// See the README for a quickstart, and the Example below.
package tollgate
