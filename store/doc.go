// Package store decides token-bucket rate limits: the [Store] interface, the
// [Limit] and [Result] values, a [Redis] store shared by every server of an
// application, and a [Memory] store for one process.
//
// # Semantics
//
// A [Limit] is a bucket of capacity Burst refilled continuously with Rate
// tokens per Period; an untouched bucket is full. Take with cost c succeeds if
// and only if c tokens are there, and takes them; a denied Take consumes
// nothing, so a client that keeps hammering gets through as soon as the rate
// allows. A cost of 0 reads the bucket; one below 0 or above Burst is an error
// wrapping [ErrInvalidCost], an unusable Limit one wrapping [ErrInvalidLimit].
//
// Both stores keep a bucket as GCRA state, the instant it is full again, in
// integer µs, and agree to the µs: [Redis] in one atomic Lua script
// ([lua.TokenBucket]) on Redis's clock, [Memory] on the monotonic one. That
// state only moves forward (but for a refund): a stale clock reading, or another
// Limit on the key, can deny, never give tokens back, so each Limit on a key
// lets through at most Burst + Rate·T, however many goroutines share it.
//
// # Several buckets, refunds, batching, keys
//
// Both stores implement [MultiStore] (TakeAll: several buckets, such as per
// user and global, all or nothing) and [Refunder] (Refund: tokens back).
// [Redis] batches concurrent Takes ([WithBatching]). A bucket exists only
// while not full (a Redis key's TTL is the time until then); [Memory] caps
// their number ([WithMaxKeys]). Redis keeps keys over 128 bytes or starting
// with '#' hashed, Memory a 128-bit seeded hash of every key, so a hostile
// header cannot blow up memory.
//
// [lua.TokenBucket]: https://pkg.go.dev/github.com/tollgate-go/tollgate/lua#TokenBucket
package store
