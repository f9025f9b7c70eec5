// Package headers writes the rate-limit fields of HTTP responses, the only place in
// tollgate that formats them: each limiter deciding a request calls [Write] with its
// [Quota] under a [Profile], and a 429 (or 503) also gets [WriteRetryAfter].
//
// [Draft11] writes the List fields of [draft-ietf-httpapi-ratelimit-headers-11], one
// item per policy name, an [RFC 9651] String (bytes outside printable ASCII as '?'):
//
//	RateLimit-Policy: "<name>";q=<quota>;w=<window>
//	RateLimit: "<name>";r=<Remaining>;t=<Reset>
//
// q/w is the sustained rate ([PolicyQuota]), r the whole tokens left and t the seconds
// until the next token, rounded up ([Seconds]) so that a client waiting as told is never
// early. Counts below zero are 0; integers are capped at 999999999999999, RFC 9651's largest.
//
// [draft-ietf-httpapi-ratelimit-headers-11]: https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-ratelimit-headers-11
// [RFC 9651]: https://www.rfc-editor.org/rfc/rfc9651
package headers
