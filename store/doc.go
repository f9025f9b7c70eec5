// Package store decides token-bucket rate limits: the [Store] interface, the
// [Limit] and [Result] values, a [Redis] store shared by every server of an
// application, and a [Memory] store for one process.
//
// Both stores keep a bucket as GCRA state, the instant it is full again, in
// integer µs, and agree to the µs: [Redis] in one atomic Lua script on Redis's
// clock, [Memory] on the monotonic one. That state only moves forward (but for
// a refund), so each Limit on a key lets through at most Burst + Rate·T,
// however many goroutines share it. Both implement [MultiStore], [Refunder],
// [Delayer] and [Admin]; a bucket exists only while not full, and no key can
// blow up memory (see [Redis.Key] and [Memory]). A Limit with a [Window] is a
// quota counted in fixed, calendar or sliding windows instead.
package store
