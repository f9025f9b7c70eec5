// Package keyfuncs extracts the subject of a rate limit from a request: the
// name of the bucket the request is charged to. A [KeyFunc] has the shape of
// httprate's, so the two are interchangeable.
//
//   - [PeerIP] and [PeerIPPrefix]: the TCP peer's address, IPv6 by /64;
//     [AppendPeerIP] appends PeerIP's key to a buffer without allocating.
//   - [ClientIP]: the client's address behind trusted proxies, from
//     X-Forwarded-For, Forwarded, or a header the proxy sets; with
//     [ClientIPMiddleware] and [ClientAddr] for handlers, and
//     [ClientIPFromContext] for an address resolved upstream.
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
//	ip:192.0.2.1            PeerIP, ClientIP, IPv4 whole   at most 46 bytes
//	ip:2001:db8:1:2::/64    PeerIP, ClientIP, IPv6 by /64
//	key:<22 chars>          Header, SHA-256 of value       26 bytes
//	user:42                 User, id up to 64 bytes        at most 69 bytes
//	user:#<22 chars>        User, longer or odd ids hashed
//	route:GET /items/{id}   Pattern or Route               at most 70 bytes
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
// Any client can send any header. A forwarding header means something only
// where a proxy of yours wrote it, and a proxy writes only its own part: it
// appends to X-Forwarded-For (or Forwarded) after whatever the client sent,
// or overwrites a single-address header. So [PeerIP] reads no header (behind
// a load balancer it puts every client in one bucket), and [ClientIP] reads
// one only from a TCP peer inside [TrustProxies] (none by default), walking
// X-Forwarded-For and Forwarded from the right, the end your proxies wrote:
// trusted addresses are skipped and the first other one is the client, never
// one further left. Anything malformed, obfuscated or over-long gives the
// peer, never an empty or shared key.
//
// The leftmost address, which many libraries return, is the one value the
// client alone wrote. Reading it lets a client evade its limit (a random
// address per request, a fresh bucket each time) or lock out a victim (its
// requests charged to the victim's address). An IPv6 client can rotate
// through the addresses of its /64 without any header, so IPv6 is grouped
// by /64 ([IPv6Prefix]); IPv4-mapped addresses are read as IPv4 first.
//
// Trust the networks of the proxies that connect to this server and of
// those in front of them (a CDN's ranges, the load balancer's subnet), no
// network that clients can send from, and choose one source: the header
// your proxies write. [TrustedHops] counts proxies that cannot be listed;
// [ClientIPFromContext] keys by an address resolved upstream.
package keyfuncs
