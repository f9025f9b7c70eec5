// Package headers writes the rate-limit fields of an HTTP response: the
// RateLimit and RateLimit-Policy fields of the IETF draft, the older
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset fields, the
// X-RateLimit-* fields, and Retry-After. It is the only place in tollgate
// that formats them, because the draft may still change.
//
// A limiter reports its state as a [Quota] with [Write], under a [Profile]
// that selects the header sets; a 429 (or 503) response also gets
// [WriteRetryAfter]. Several limiters deciding one request each call Write
// on the same [http.Header], and their reports merge instead of
// overwriting each other.
//
// # Formats
//
// [Draft11] writes two RFC 9651 Lists of draft-ietf-httpapi-ratelimit-headers-11,
// with one item per policy, named by [Quota.Name]:
//
//	RateLimit-Policy: "<name>";q=<quota>;w=<window>
//	RateLimit: "<name>";r=<Remaining>;t=<Reset>
//
// q/w is the sustained rate, [Quota.Rate] tokens per [Quota.Window] (see
// [PolicyQuota]: w is the window in whole seconds, q the tokens that fall in
// it, rounded down); r is the whole tokens left, at most the bucket's
// capacity [Quota.Limit], and t the seconds until the next token (0 when
// the bucket is full).
//
// The name is an RFC 9651 String: '"' and '\' escaped, and each byte outside
// printable ASCII written as '?' ("café" is "caf??"), so the field parses.
//
// [Draft03] writes the three single-value fields of
// draft-ietf-httpapi-ratelimit-headers-03, which deployed clients read:
//
//	RateLimit-Limit: <Limit>
//	RateLimit-Remaining: <Remaining>
//	RateLimit-Reset: <Reset>
//
// [XRateLimitEpoch] and [XRateLimitDelta] write the same three values as
// X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, the reset as
// a Unix time in seconds (as GitHub does) or in delay-seconds. Only one of
// them can be chosen; see [Profile.Validate]. [Default] is Draft11|Draft03.
//
// # Merging
//
// In the List fields each policy has one item: writing a Quota replaces the
// item of its name in place, or appends one; other items, also other code's,
// are kept. A List is kept only if each member is an Item as rate limiters
// write them (a String or Token, or an inner list of bare items, with
// parameters that are Integers, Decimals, Strings, Tokens, Byte Sequences or
// Booleans); any other is replaced by the new item alone, so every field
// Write leaves parses (fuzzed with a full RFC 9651 parser, in the tests).
//
// The single-value fields report the tightest quota: the fewest tokens
// remaining, then the later reset, then the smaller limit. Write replaces
// them only with a tighter quota, or when they are missing or not plain
// integers; a strict order, so the order of Writes does not matter.
// [WriteRetryAfter] sets Retry-After to the delay it is given, never earlier
// than the reset of an exhausted quota (r=0, or Remaining 0) in the header.
//
// # Rounding
//
// [Seconds] rounds durations up, so a client that waits as long as it is
// told is never early: 1ns is 1 second, 1s+1ns is 2; zero and negative are 0.
// The window w and Retry-After are at least 1; the epoch reset is the first
// whole second at or after now+Reset. Counts below zero are 0, and integers
// are capped at 999999999999999, the largest RFC 9651 Integer.
//
// Write and WriteRetryAfter keep no state and are safe for concurrent use on
// different headers. Write sets each field with [http.Header.Set] and formats
// every value (12 allocations for one quota under Default); the middleware
// reuses the values of each (remaining, reset) pair.
//
// # References
//
//   - [draft-ietf-httpapi-ratelimit-headers-11], RateLimit header fields for HTTP.
//   - [draft-ietf-httpapi-ratelimit-headers-03], with RateLimit-Limit,
//     RateLimit-Remaining and RateLimit-Reset.
//   - [RFC 9651], Structured Field Values for HTTP.
//   - [RFC 9110, Section 10.2.3], Retry-After and delay-seconds.
//
// [draft-ietf-httpapi-ratelimit-headers-11]: https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-ratelimit-headers-11
// [draft-ietf-httpapi-ratelimit-headers-03]: https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-ratelimit-headers-03
// [RFC 9651]: https://www.rfc-editor.org/rfc/rfc9651
// [RFC 9110, Section 10.2.3]: https://www.rfc-editor.org/rfc/rfc9110#section-10.2.3
package headers
