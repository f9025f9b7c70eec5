// Package keyfuncs extracts the subject of a rate limit from a request: the
// name of the bucket the request is charged to. A [KeyFunc] has the shape of
// httprate's, so the two are interchangeable.
//
//   - [PeerIP] and [PeerIPPrefix]: the TCP peer's address, IPv6 by /64.
//   - [Header]: a header that identifies the client, such as an API key.
//   - [User]: the authenticated user id that the app's auth middleware put
//     in the request context.
//   - [Pattern] and [Route]: the route pattern that matched, from
//     [http.ServeMux] or from any router through a small function.
//   - [Join]: several of these at once, such as per user per route.
//   - [Static]: one bucket for every request, a global limit.
//
// # Keys
//
// Every key is namespaced by what it holds, so keys of different kinds
// never collide, and is short, so a hostile request cannot blow up the
// store's memory:
//
//	ip:192.0.2.1            PeerIP, IPv4 whole          at most 46 bytes
//	ip:2001:db8:1:2::/64    PeerIP, IPv6 by /64
//	key:<22 chars>          Header, SHA-256 of value    26 bytes
//	user:42                 User, id up to 64 bytes     at most 69 bytes
//	user:#<22 chars>        User, longer or odd ids hashed
//	route:GET /items/{id}   Pattern or Route            at most 70 bytes
//
// Secrets (header values) and ids or patterns longer than 64 bytes or
// holding bytes outside printable ASCII are hashed: the first 22 characters
// of the unpadded base64url SHA-256, 132 bits. [Join] separates its parts
// by '|' and escapes '\' and '|' in them; [Static] returns its key as
// given. The middleware adds a prefix and the limiter's name in front.
//
// # Errors
//
// A request a KeyFunc cannot key, such as one without the API key header or
// without an authenticated user, is an error wrapping [ErrNoKey], never an
// empty or shared key: such a request must not land in a bucket it shares
// with others. A KeyFunc built from unusable arguments fails with an error
// wrapping [ErrInvalidConfig].
//
// # Trust model
//
// [PeerIP] trusts only the TCP peer (Request.RemoteAddr) and never reads a
// forwarding header, which any client can forge. Behind a reverse proxy or
// load balancer, every client reaches the server from the proxy's address,
// so PeerIP puts them all in one bucket. There, key by the client address
// that trusted proxies report (a trusted-proxy ClientIP resolver is
// coming), or by [Header] or [User].
package keyfuncs
