// Package headers writes the rate-limit fields of an HTTP response, and is
// the only place in tollgate that formats them, because the draft may still
// change. Each limiter deciding a request calls [Write] with its [Quota]
// under a [Profile]; a 429 (or 503) also gets [WriteRetryAfter]. Limiters
// writing to the same [http.Header] merge their reports.
//
// [Draft11] writes the List fields of [draft-ietf-httpapi-ratelimit-headers-11],
// one item per policy name:
//
//	RateLimit-Policy: "<name>";q=<quota>;w=<window>
//	RateLimit: "<name>";r=<Remaining>;t=<Reset>
//
// q/w is the sustained rate ([PolicyQuota]), r the whole tokens left and t
// the seconds until the next token. The name is an [RFC 9651] String, each
// byte outside printable ASCII written as '?'. Other members of a List are
// kept only if they are items as rate limiters write them, so every field
// Write leaves parses.
//
// [Draft03] writes RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset of
// [draft-ietf-httpapi-ratelimit-headers-03], which deployed clients read;
// [XRateLimitEpoch] and [XRateLimitDelta] write the same values as
// X-RateLimit-*, the reset as a Unix time or in delay-seconds. These fields
// report the tightest quota: the fewest remaining, then the later reset,
// then the smaller limit. [Default] is Draft11|Draft03.
//
// [Seconds] rounds durations up, so a client that waits as long as it is
// told is never early; w and Retry-After are at least 1. Counts below zero
// are 0, and integers are capped at 999999999999999, the largest RFC 9651
// Integer.
//
// [draft-ietf-httpapi-ratelimit-headers-11]: https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-ratelimit-headers-11
// [draft-ietf-httpapi-ratelimit-headers-03]: https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-ratelimit-headers-03
// [RFC 9651]: https://www.rfc-editor.org/rfc/rfc9651
package headers
