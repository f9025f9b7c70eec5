// Package lua holds tollgate's Redis Lua scripts and documents their
// protocol, so that a service written in another language can share the same
// buckets by running the same script with the same arguments.
//
// # Token bucket
//
// [TokenBucket] is a token bucket kept as GCRA state (the bucket's
// theoretical arrival time, one integer per key) and decided in one atomic
// call on Redis's own clock (TIME). A bucket of capacity burst gets rate
// tokens per period_us microseconds; a decision takes cost tokens when all of
// them are there. T = period_us/rate is the time one token takes.
//
// The script has two forms. Both read and write the same state, so they can
// be mixed on one key.
//
// # One key
//
// The one-key form takes the limit already in the units of the bucket's
// debt (how far it is from full), so that Redis, which every app server
// shares, parses three numbers and formats one:
//
//	EVALSHA <TokenBucketSHA1> 1 <key> <cap> <k>         when rate divides period_us
//	EVALSHA <TokenBucketSHA1> 1 <key> <cap> <k> <Q>     otherwise
//
// A debt counts in units of 1/Q microsecond, where Q/t is rate/period_us in
// lowest terms (Q = rate/gcd(rate, period_us), t = period_us/gcd; Q = 1 when
// rate divides period_us): one token is t units, the coarsest unit that
// keeps T exact. cap = burst*t is the bucket's capacity and k = cost*t; both
// are integers with 1 <= cap <= 2^50 and -cap <= k <= cap. k = 0 reads the
// bucket; a negative k gives tokens back, never above capacity. A limit
// whose cap would exceed 2^50 takes the general form.
//
// The reply is one integer. D >= 0: the cost was taken (always when k <= 0)
// and D is the debt after it; -1-D < 0: denied, nothing written, and D is the
// debt. Then
//
//	remaining       = floor((cap - D) / t)          whole tokens left
//	reset_after_us  = ceil(D / Q)                   until the bucket is full
//	retry_after_us  = ceil((D + k - cap) / Q)       after a denial: until cost tokens are there
//
// # General form
//
// The general form decides one bucket or several together, all or nothing,
// with four arguments per key:
//
//	EVALSHA <TokenBucketSHA1> n <key1> ... <keyn> <rate1> <period_us1> <burst1> <cost1> ... <costn>
//
// All arguments are integers; rate, period_us and burst are at least 1,
// -burst <= cost <= burst, and burst*rate and burst*(floor(period_us/rate)+1)
// are at most 2^50. A negative cost gives -cost tokens back (a refund), never
// above capacity. The tokens are taken from every bucket if every bucket has
// them, else from none. The reply holds four integers per key, in KEYS
// order:
//
//	[1] allowed         1 if the cost was taken (always 1 when no cost > 0), else 0
//	[2] remaining       whole tokens left after the decision
//	[3] retry_after_us  microseconds until the bucket holds cost tokens
//	                    (rounded up); 0 when it holds them now
//	[4] reset_after_us  microseconds until the bucket is full again (rounded up)
//
// On Redis Cluster the keys of one call must share a {hash tag}.
//
// # State
//
// A denied decision writes nothing, and cost 0 only reads. Every write sets
// the key's expiry to the time until the bucket is full again, so no key
// lives without a TTL and a full bucket occupies no memory. The key's value
// is "<tat>" or "<tat>+<f>/<Q>": the instant, in microseconds of Redis's
// clock, at which the bucket is full again, plus f/Q of a microsecond when
// period_us is not a multiple of rate (Q as above). Arguments out of range
// get an error
// reply starting with "ERR tollgate:". The header of tokenbucket.lua states
// the same protocol next to the code.
package lua
