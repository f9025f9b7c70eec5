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
// The name is written as an RFC 9651 String: '"' and '\' are escaped with a
// backslash, and every byte outside printable ASCII (0x20 to 0x7E), which a
// String cannot hold, is replaced by '?', so a name that is not ASCII, such
// as "café", is written "caf??" (one '?' per byte) and the field always
// parses. Two names that are the same after this replacement are the same
// policy.
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
// Header keys are stored in their canonical form, as [http.Header.Set]
// stores them ("Ratelimit-Policy"); field names are case-insensitive on the
// wire.
//
// # Merging
//
// In the List fields, each policy has one item. Writing a Quota replaces the
// item that has its name, in place, and appends an item if there is none;
// items of other names, including items that other code wrote with other
// parameters, are kept as they were written. Field lines are combined as
// RFC 9651 prescribes and written back as one line. The members are found
// without a full RFC 9651 parser: a List is kept only if each member is an
// Item as rate limiters write them (a String or Token, or an inner list of
// bare items, with parameters whose values are Integers, Decimals, Strings,
// Tokens, Byte Sequences or Booleans); any other List field, one that does
// not parse among them, is replaced by the new item alone, so that every
// field Write leaves parses (fuzzed with a full parser, which lives in the
// tests).
//
// The single-value fields can report one quota only, so they report the
// tightest: the one with the fewest tokens remaining; on a tie, the one
// with the later reset; on a tie again, the smaller limit. Write reads the
// three values already in the header and writes its own only if they are
// tighter, or if the fields are missing or are not plain non-negative
// integers. Because this is a strict order, the result does not depend on
// the order of the Writes. In epoch mode the resets compared are Unix times,
// which order the same way. These fields carry no policy name, so
// writing the same policy twice keeps the tighter of its two states there,
// where the List fields keep the last.
//
// [WriteRetryAfter] reads what Write wrote: it sets Retry-After to the delay
// it is given, but never earlier than the reset of a quota that is exhausted
// (r=0 in the List, or Remaining 0 in the single-value fields).
//
// # Rounding
//
// Durations are converted to seconds by [Seconds], which rounds up, so a
// client that waits as long as it is told is never early: 1ns is 1 second,
// 1s is 1, and 1s+1ns is 2. Zero and negative durations are 0. The window w
// is at least 1, because the draft requires a non-zero window. Retry-After
// is at least 1. The epoch reset is the first whole second at or after
// now+Reset.
//
// Counts below zero are written as 0, and every integer is capped at
// 999999999999999, the largest RFC 9651 Integer, so that each value parses.
//
// # Cost
//
// Write and WriteRetryAfter keep no state: they are safe for concurrent use
// on different headers, and like [http.Header] itself not on the same one.
// Write sets each field with [http.Header.Set], a slice of its own, and
// formats every value: about ten allocations. The middleware calls it on
// the first response of each (remaining, reset) pair and reuses its values.
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
