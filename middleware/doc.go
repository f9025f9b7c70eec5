// Package middleware is tollgate's rate-limiting HTTP middleware: a
// [Limiter] (one limit) or a [Multi] (several, all or nothing) wraps any
// [http.Handler] and decides each request on a [store.Store] shared by every
// server of an application.
//
// # One request
//
//  1. Skip rules and allow-lists ([WithSkip], [WithAllowList]).
//  2. The key ([WithKeyFunc], default [keyfuncs.PeerIP]) and the cost
//     ([WithCost], default 1); a key error or a cost outside [0, Burst] is
//     refused with 400 ([WithKeyErrorHandler]), never a shared bucket.
//  3. The local deny cache, if on ([WithDenyCache]).
//  4. One decision of the store within the budget ([WithTimeout]), through a
//     circuit breaker ([WithBreaker]); a wait for tokens ([WithDelay]).
//  5. The rate-limit headers ([WithHeaders]), then the next handler, or 429
//     with Retry-After ([WithDeniedHandler], [WithProblemDetails]).
//  6. Refunds and strikes after the response ([WithRefund], [WithPenalty]).
//
// Every step is reported to an [Observer] ([WithObserver], [SlogObserver]).
// Limiters nest: each adds its item to the RateLimit fields, and the
// single-value fields report the tightest; a request an inner limiter
// refuses has been counted by the outer ones, which a [Multi] avoids.
//
// # Failure policies
//
// When the store fails or times out, the [FailurePolicy] decides:
// [FailLocal] (the default) on an in-process share of the limit,
// [FailClosed] refuses with 503, [FailOpen] serves unlimited.
//
// # Keys
//
// A bucket's key is "<name>:<subject>" ([WithName]; the store prefixes it).
// The default name differs per limiter and is the same in every replica of
// the app: replicas share a limiter's buckets, and two limiters that key by
// the same address share theirs only when given one name. See
// [Limiter.StoreKey] and [Multi] for the hash tags that keep Redis Cluster
// happy.
//
// ExampleNew_chi shows a chi router with one limiter per route group.
package middleware
