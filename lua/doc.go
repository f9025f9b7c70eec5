// Package lua holds tollgate's Redis Lua script and documents its protocol, so
// that a service in another language can share the buckets by running it.
//
// # Token bucket
//
// [TokenBucket] decides groups of token buckets, each group all or nothing,
// in one atomic call on Redis's clock (TIME). A bucket of capacity burst gets
// rate tokens per period_us microseconds. Its state is its theoretical arrival
// time (TAT), the instant it is full again; its debt D = max(TAT - now, 0) is
// how far it is from full. Time counts in units of 1/q µs, where q = rate/g
// and t = period_us/g, g = gcd(rate, period_us): one token takes t units exactly.
//
//	EVALSHA <TokenBucketSHA1> n <key1> ... <keyn> <m> <k1> <cap1> <q1> ... <km> <capm> <qm> [<m'> ...]
//
// ARGV is one or more groups: a group's size m >= 1, then the arguments of its
// m keys, which are the next m of KEYS (n in all). For a decision of c tokens,
// k = c*t (0 reads the bucket; a negative k gives -c tokens back, never above
// full) and cap = burst*t, integers with 1 <= cap <= 2^50, -cap <= k <= cap and
// 1 <= q <= 2^50. If for every bucket of a group k <= 0 or D + k <= cap, each
// of its TATs becomes max(TAT, now) + k/q; otherwise nothing of it is written.
// Groups are decided one after another: a later group sees an earlier one's
// writes (a key may be in several). The reply is, per group, {allowed, du1,
// df1, ..., dum, dfm}, flattened: allowed is 1 if the group's ks were applied,
// and bucket i's debt after the call is dui + dfi/q µs (0 <= dfi < q); it is
// -1 if a key of the group holds a value of another type (nothing of the group
// written, its values meaningless), and a call of one group replies Redis's
// error instead. Every argument is checked before anything is read or written,
// so an "ERR tollgate:" reply has written nothing. From a debt D = du*q + df
// units, a caller reads
//
//	remaining       = floor((cap - D) / t), at least 0   whole tokens left
//	reset_after_us  = du + (1 if df > 0)                  until the bucket is full
//	retry_after_us  = ceil((D + k - cap) / q)             after a denial: until k fits
//
// A Take is a call of one group of one key; tollgate's batching sends the
// concurrent Takes for one Redis node as one call of many groups.
// On Redis Cluster the keys of one call must share a {hash tag}.
//
// # Window quotas
//
// A key of a group may instead be a window quota: a count of at most quota
// per window, its arguments four or seven instead of three:
//
//	<k> <quota> <kind> <period_us>          windows of period_us from the epoch (kind -2, -3)
//	<k> <quota> <kind> <b0> <b1> <b2> <b3>  three windows the caller computed (kind 0, -1)
//
// k is the cost (negative: given back, not below 0), 1 <= quota <= 2^50, and
// kind -2 or 0 for a fixed window, -3 or -1 for a sliding one. With a period
// (1 <= period_us <= 2^50) the script finds the window of Redis's now,
// [s, s + period_us) with s = now - now % period_us, and the ones before and
// after it. Else b0 < b1 < b2 < b3 are the µs bounds of three windows around
// the caller's clock (a calendar's): the script counts in the one holding
// Redis's now (the first, now moved into it, if now < b0).
// A fixed window's count is cur; a sliding one's, cur plus
// floor(prev*(end-now)/(end-start)) of the window before it (exact while
// quota*(end-start) <= 2^50). A state of a later window than now's (a clock
// gone back) is decided in that window, at its start. k fits when k <= 0 or
// count + k <= quota; then (all fitting) cur becomes max(cur + k, 0), but a
// negative k applies only in the window [b1, b2) (with a period: now's): the
// caller puts there the window of the take it gives back. A state is
// written only if cur changed.
// A state of a window past the bounds refuses every take and refund, and so
// do bounds Redis's now is past (b3 <= now: a caller's clock or queue a
// window late; never with a period), replying cur = quota and start = b3.
// The key's reply is four integers, now (moved into its window), prev, cur
// and the state's start, after the call; a state counted as nothing is
// deleted.
//
// # State
//
// A key's value is "<u>" or "<u>+<f>/<q>": TAT = u + f/q µs of Redis's clock.
// Only a refund moves a TAT back: neither a denial nor a decision under another
// limit on the key (its fraction, in another q, rounded up) hands tokens back.
// Every write sets the key's expiry to the time until the bucket is full, so no
// key lives without a TTL; a full bucket is deleted. A window quota's value is
// "<start>:<prev>:<cur>", its expiry the end of its window from Redis's now (a
// sliding one's, a window later). A value that is not a state
// reads as a full bucket; arguments out of range get an "ERR tollgate:" reply.
package lua
