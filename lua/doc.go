// Package lua holds tollgate's Redis Lua scripts and documents their
// protocol, so that a service written in another language can share the same
// buckets by running the same script with the same arguments.
//
// # Token bucket
//
// [TokenBucket] is a token bucket kept as GCRA state (the bucket's
// theoretical arrival time, one integer per key) and decided in one atomic
// call on Redis's own clock (TIME). For one bucket it is run as
//
//	EVALSHA <TokenBucketSHA1> 1 <key> <rate> <period_us> <burst> <cost>
//
// where rate tokens are added per period_us microseconds to a bucket of
// capacity burst, and cost tokens are taken when all of them are there.
// All four arguments are integers; rate, period_us and burst are at least 1,
// -burst <= cost <= burst, and burst*rate and burst*(floor(period_us/rate)+1)
// are at most 2^50. A negative cost gives -cost tokens back (a refund), never
// above capacity.
//
// The reply is an array of four integers:
//
//	[1] allowed         1 if the cost was taken (always 1 when cost <= 0), else 0
//	[2] remaining       whole tokens left after the decision
//	[3] retry_after_us  microseconds until the bucket holds cost tokens
//	                    (rounded up); 0 when it holds them now
//	[4] reset_after_us  microseconds until the bucket is full again (rounded up)
//
// Several buckets are decided together, all or nothing, by passing n keys
// and four arguments per key in the same order:
//
//	EVALSHA <TokenBucketSHA1> n <key1> ... <keyn> <rate1> <period_us1> <burst1> <cost1> ... <costn>
//
// The tokens are taken from every bucket if every bucket has them, else
// from none; the reply holds four integers per key, in KEYS order, with the
// same allowed in each. On Redis Cluster the keys must share a {hash tag}.
//
// A denied decision writes nothing, and cost 0 only reads. Every write sets
// the key's expiry to the time until the bucket is full again, so no key
// lives without a TTL and a full bucket occupies no memory. The key's value
// is "<tat>" or "<tat>+<f>/<rate>": the instant, in microseconds of Redis's
// clock, at which the bucket is full again, plus f/rate of a microsecond when
// period_us is not a multiple of rate. The header of tokenbucket.lua states
// the same protocol next to the code.
package lua
