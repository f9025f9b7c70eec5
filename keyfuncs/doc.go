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
// Any client can send any header. X-Forwarded-For, Forwarded, X-Real-IP and
// the like mean something only when a proxy of yours wrote them, and a
// proxy writes only its own part: it appends the address it received the
// request from to X-Forwarded-For (or Forwarded) after whatever the client
// sent, or it overwrites a single-address header. So:
//
//   - [PeerIP] trusts only the TCP peer (Request.RemoteAddr) and reads no
//     header. Behind a reverse proxy or load balancer every client reaches
//     the server from the proxy's address, so PeerIP puts them all in one
//     bucket.
//   - [ClientIP] reads a forwarding header only when the TCP peer is inside
//     a network given to [TrustProxies] — none by default. A client that
//     connects directly, or through a proxy that is not listed, gets its
//     own address, whatever headers it sends.
//   - Through a trusted peer, X-Forwarded-For and Forwarded are walked from
//     the right, the end that your proxies wrote: addresses of trusted
//     proxies are skipped and the first untrusted address is the client,
//     the one your outermost proxy saw. The walk never goes further left:
//     everything there came from the client.
//   - Anything malformed, unknown, obfuscated or over-long (beyond the last
//     8 KiB of a header, or more than [MaxForwarded] elements) gives the TCP
//     peer, never the next address to the left and never an empty or shared
//     key.
//
// The leftmost address is what many libraries return as "the client", and
// it is wrong: it is the one value in the header that the client alone
// wrote. Reading it, or reading any header from an untrusted peer, lets a
// client do two things that a per-IP limit exists to prevent:
//
//   - Evasion. A client that sends "X-Forwarded-For: <random address>"
//     gets a fresh bucket with every request and is never limited. An IPv6
//     client can do the same without any header by rotating through the
//     2^64 addresses of its /64; ClientIP and PeerIP group IPv6 addresses
//     by /64 ([IPv6Prefix] sets /56 or /48) so they share one key.
//     IPv4-mapped addresses (::ffff:192.0.2.1, from dual-stack listeners or
//     headers) are read as IPv4 before grouping, so they neither escape
//     their IPv4 key nor fall into one /64 shared by every IPv4 client.
//   - Lock-out. A client that sends a victim's address gets its requests
//     charged to the victim's bucket: it exhausts the victim's quota and
//     the victim is refused. With ClientIP the sender's own address, as
//     your proxy appended it, is always the one keyed; the victim's
//     address on the left is never read.
//
// Choose the networks of the proxies that connect to this server and of the
// proxies in front of them (a CDN's published ranges, the load balancer's
// subnet), and one source: the header your proxies write. Trust no
// network that clients can send from. When the proxies' addresses cannot be
// listed, [TrustedHops] counts them instead; when the client address is
// resolved upstream (chi's middleware.ClientIPFrom*), [ClientIPFromContext]
// keys by it. With [FromHeader], name only a header that your proxy
// overwrites: one that it passes through is whatever the client chose.
package keyfuncs
