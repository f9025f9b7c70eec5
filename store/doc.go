// Package store decides token-bucket rate limits: the [Store] interface,
// the [Limit] and [Result] values, a [Redis] store shared by every server of
// an application, and a [Memory] store for one process.
//
// # Semantics
//
// A [Limit] is a bucket of capacity Burst refilled continuously with Rate
// tokens per Period. A bucket nobody has touched is full. Take with cost c
// succeeds if and only if at least c tokens are there, and then takes them;
// a denied Take consumes nothing, so a client that keeps hammering is let
// through again as soon as the rate allows. A cost of 0 reads the bucket.
// A cost below 0 or above Burst can never succeed and is an error wrapping
// [ErrInvalidCost]; an unusable Limit is an error wrapping [ErrInvalidLimit].
//
// Both stores keep a bucket as GCRA state, the instant at which it is full
// again, in integer microseconds, with the same arithmetic, and agree to the
// microsecond on every result. That state only moves forward (but for a
// refund): a decision made from a stale clock reading, or under another
// Limit on the same key, can deny, never hand tokens back, so each Limit
// used on a key lets through at most its own Burst + Rate·T, however many
// goroutines share it. [Redis] decides with one atomic Lua script
// ([lua.TokenBucket]) on Redis's own clock, so the clocks of app servers
// never enter a decision; [Memory] uses the process's monotonic clock.
//
// # Several buckets, refunds, batching
//
// Both stores implement [MultiStore]: TakeAll takes from several buckets
// (per user and global, per second and per hour) all or nothing, and
// [Refunder]: Refund gives tokens back, never above capacity. [Redis]
// batches concurrent Takes into pipelines per node ([WithBatching]), with
// no linger at low load, each Take still one script call.
//
// # Keys and memory
//
// A bucket exists only while it is not full. Redis keys carry a TTL equal to
// the time until the bucket is full again; the Memory store drops full
// buckets and caps the number it holds (see [WithMaxKeys]). In Redis, keys
// longer than 128 bytes, or starting with '#', are stored under their
// SHA-256; the Memory store keys buckets by a 128-bit hash of the key.
//
// [lua.TokenBucket]: https://pkg.go.dev/github.com/tollgate-go/tollgate/lua#TokenBucket
package store
