// Package middleware is tollgate's rate-limiting HTTP middleware: a
// [Limiter] wraps any [http.Handler] (chi, gorilla/mux, [http.ServeMux]) and
// decides each request on a [store.Store] shared by every server of an
// application.
//
// # One request
//
// Skip rules ([WithSkip]) → the KeyFunc ([WithKeyFunc], default
// [keyfuncs.PeerIP]) → the cost ([WithCost], default 1) → the local deny
// cache, if on ([WithDenyCache]) → one Take on the store within the timeout
// budget ([WithTimeout], default 100ms) → the rate-limit headers
// ([WithHeaders]) → the next handler, or a refusal:
//
//   - over the limit: 429 with Retry-After, Cache-Control: no-store and a
//     short text body, or an RFC 9457 problem document
//     ([WithProblemDetails]), or whatever [WithDeniedHandler] writes;
//   - no key, or a cost outside [0, Burst]: 400 (never a shared bucket,
//     never a 429 that would invite a retry), see [WithKeyErrorHandler];
//   - the store failed or timed out: the [FailurePolicy] decides, [FailLocal]
//     (an in-process share of the limit, the default; see [FailLocalShare]),
//     [FailClosed] (503 with Retry-After) or [FailOpen] (serve, unlimited).
//
// A circuit breaker ([WithBreaker]) stops calling a store that keeps
// failing and lets one probe through after a cooldown, so a dead Redis
// costs no waiting per request.
//
// # Cost
//
// An allowed request allocates nothing in the limiter with the default
// key function, the default headers and the Memory store: the store key is
// built in a pooled buffer, and the header values of each (remaining, reset)
// pair are formatted once and shared by the responses that report it. (So
// code after the limiter must replace a rate-limit field, as
// [http.Header.Set] does, never write into its slice.)
// On the Redis store the key is copied once for the client.
//
// # Names and keys
//
// Each limiter has a name ([WithName]; by default its limit and where it was
// made, such as "100-per-1m@9c1d02e7", so that no two limiters of a process
// share buckets unless named alike). The store key of a request is
// "<name>:<subject>" (on Redis, "tollgate:<name>:<subject>"), so two limiters
// that key by the same address never share a bucket. A subject that holds a
// brace, as a route pattern does, gives "{<name>:<subject>}": the braces make
// the whole key a Redis Cluster hash tag, so the subject's own cannot pin
// keys to one slot. A [Multi]'s policies use "<name>:{<subject>}", so that
// the buckets of one subject share a slot and one script call. The name is
// also the policy's name in the RateLimit headers: give each limiter on a
// route its own.
//
// # Several limiters
//
// Limiters nest: a per-route limiter around a per-user one. Each adds its
// own item to the RateLimit and RateLimit-Policy fields, and the
// single-value fields report the tightest. A request refused by an inner
// limiter has already been counted by the outer ones.
//
// [Multi] avoids that: [NewMulti] decides several [Policy] values (10/s
// and 1000/h per user, a per-route limit, a global limit) in one
// [store.MultiStore.TakeAll], all or nothing, so a request refused by one
// policy consumes from none; [NewTiered] picks the policies per request
// ([Tiers]: free, pro, …) without rebuilding the middleware.
//
// # Refunds, allow-lists, observability
//
// [WithRefund] gives a request's tokens back after its response when a
// rule of the request and status says so (refund 5xx; count only failed
// logins). [WithAllowList] lets addresses, networks and keys through
// without asking the store. [WithObserver] reports every decision, error,
// fallback, skip and breaker transition as an [Event] carrying the key's
// class ([KeyClass]), never the key; [SlogObserver] logs them, and the
// promobserver module exports them to Prometheus with bounded labels.
package middleware
