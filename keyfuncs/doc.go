// Package keyfuncs extracts the subject of a rate limit from a request, the
// key of the bucket it is charged to, as a [KeyFunc] of httprate's shape:
// [PeerIP] by the TCP peer, [ClientIP] by the client behind trusted proxies,
// [Header] by an API key, [User] by the authenticated user, [Pattern] and
// [Route] by route, [Join] by several at once, [Static] for a global limit.
//
// Keys are namespaced ("ip:", "key:", "user:", "route:") and short: header
// values, and ids or patterns over 64 bytes or outside printable ASCII, are
// hashed (22 characters of base64url SHA-256). A request without a key is an
// error wrapping [ErrNoKey], never a shared bucket; a constructor given
// unusable arguments returns an error wrapping [ErrInvalidConfig].
package keyfuncs
