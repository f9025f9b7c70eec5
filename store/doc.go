// Package store decides token-bucket rate limits: the [Store] interface, the
// [Limit] and [Result] values, a [Redis] store shared by every server of an
// application, and a [Memory] store for one process.
//
// A [Limit] is a bucket of capacity Burst refilled continuously with Rate
// tokens per Period; an untouched bucket is full. Take with cost c succeeds if
// and only if c tokens are there, and takes them; a denied Take consumes
// nothing. A cost of 0 reads the bucket; one below 0 or above Burst is an
// error wrapping [ErrInvalidCost], an unusable Limit one wrapping
// [ErrInvalidLimit]. Both stores keep a bucket as GCRA state, the instant it
// is full again, in integer µs, and agree to the µs: [Redis] in one atomic Lua
// script on Redis's clock, [Memory] on the monotonic one. That state only
// moves forward (but for a refund), so each Limit on a key lets through at
// most Burst + Rate·T, however many goroutines share it. Both implement
// [MultiStore] (TakeAll, all or nothing) and [Refunder]; a bucket exists only
// while not full, and no key can blow up memory (see [Redis.Key] and [Memory]).
//
// A Limit with a [Window] is a quota counted in windows instead: fixed
// windows from the epoch or from each midnight of a [time.Location],
// calendar months, or a sliding-window counter, with the same rules.
package store
