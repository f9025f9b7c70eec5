// Package store decides token-bucket rate limits: the [Store] interface, the
// [Limit] and [Result] values, a [Redis] store shared by every server of an
// application, and a [Memory] store for one process.
//
// # Semantics
//
// A [Limit] is a bucket of capacity Burst refilled continuously with Rate
// tokens per Period; a bucket nobody has touched is full. Take with cost c
// succeeds if and only if at least c tokens are there, and then takes them; a
// denied Take consumes nothing, so a client that keeps hammering is let
// through again as soon as the rate allows. A cost of 0 reads the bucket. A
// cost below 0 or above Burst is an error wrapping [ErrInvalidCost]; an
// unusable Limit, one wrapping [ErrInvalidLimit].
//
// Both stores keep a bucket as GCRA state, the instant at which it is full
// again, in integer microseconds, with the same arithmetic, and agree to the
// microsecond on every result. That state only moves forward (but for a
// refund): a stale clock reading, or another Limit on the same key, can deny,
// never hand tokens back, so each Limit used on a key lets through at most
// its own Burst + Rate·T, however many goroutines share it. [Redis] decides
// in one atomic Lua script ([lua.TokenBucket]) on Redis's clock, so app
// servers' clocks never enter a decision; [Memory] uses the monotonic clock.
//
// # Several buckets, refunds, batching, keys
//
// Both stores implement [MultiStore] (TakeAll: several buckets, such as per
// user and global, all or nothing) and [Refunder] (Refund: tokens back, never
// above capacity). [Redis] batches concurrent Takes into pipelines per node
// ([WithBatching]), with no linger at low load. A bucket exists only while it
// is not full: a Redis key's TTL is the time until it is full again, and
// [Memory] drops full buckets and caps how many it holds ([WithMaxKeys]).
// Both keep a key longer than 128 bytes, or starting with '#', under a hash
// of it (Redis: SHA-256), so a hostile header cannot blow up memory.
//
// [lua.TokenBucket]: https://pkg.go.dev/github.com/tollgate-go/tollgate/lua#TokenBucket
package store
