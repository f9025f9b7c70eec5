// Package middleware is tollgate's rate-limiting HTTP middleware: a [Limiter] (one limit) or a
// [Multi] (several, all or nothing) wraps any [http.Handler] and decides each request on a
// [store.Store] shared by every server of an application.
//
// # One request
//
//  1. Skip rules and allow-lists ([WithSkip], [WithAllowList]).
//  2. The key ([WithKeyFunc]) and the cost ([WithCost]); a key error or a cost outside [0, Burst]
//     is refused ([WithKeyErrorHandler]).
//  3. The local deny cache, if on ([WithDenyCache]).
//  4. One store decision within the budget ([WithTimeout]) through a circuit breaker
//     ([WithBreaker]), else the [FailurePolicy]; a wait for tokens ([WithDelay]).
//  5. The rate-limit headers ([WithHeaders]), then the next handler, or 429 with Retry-After
//     ([WithDeniedHandler], [WithProblemDetails]).
//  6. Refunds and strikes after the response ([WithRefund], [WithPenalty]).
//
// Every step is reported to an [Observer] ([WithObserver], [SlogObserver]). Nested limiters each
// add their item to the RateLimit fields; a request an inner one refuses has been counted by the
// outer ones, which a [Multi] avoids.
//
// # Buckets
//
// A bucket's key is "<name>:<subject>" ([WithName], [Limiter.StoreKey]), so limiters share
// buckets only when given one name. The default name is per limiter and the same in every replica
// of the app: replicas share each limiter's buckets.
//
// ExampleNew_chi shows a chi router with one limiter per route group.
package middleware
