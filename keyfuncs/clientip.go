package keyfuncs

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// DefaultMaxForwarded is the number of forwarded elements (addresses of
// X-Forwarded-For, elements of Forwarded) that [ClientIP] walks from the
// right unless [MaxForwarded] says otherwise: far more proxies than any real
// chain has.
const DefaultMaxForwarded = 20

// maxMaxForwarded bounds [MaxForwarded].
const maxMaxForwarded = 256

// maxForwardedBytes bounds how much of a forwarding header the resolver
// reads, counted from the right end across all its field lines: a hostile
// header costs at most this much work, whatever its length.
const maxForwardedBytes = 8 << 10

// Canonical names of the forwarding headers.
const (
	headerXFF       = "X-Forwarded-For"
	headerForwarded = "Forwarded"
)

// An IPOption configures [ClientIP], [ClientIPMiddleware] or
// [ClientIPFromContext]. Its zero value is not a valid option: the
// constructors refuse it with an error wrapping [ErrInvalidConfig].
type IPOption struct {
	apply func(*ipConfig) error
}

// sourceKind says where the resolver reads the client address once the TCP
// peer is trusted.
type sourceKind uint8

const (
	sourcePeer      sourceKind = iota // no source: the peer itself
	sourceXFF                         // X-Forwarded-For, right to left, skipping trusted
	sourceForwarded                   // Forwarded for=, right to left, skipping trusted
	sourceHops                        // X-Forwarded-For, a fixed number of hops
	sourceHeader                      // one address in a header the proxy overwrites
)

// resolver finds the client address of a request. It is immutable once
// built, so one serves every request concurrently.
type resolver struct {
	trusted []netip.Prefix // masked; IPv4-mapped networks unmapped
	source  sourceKind
	header  string // sourceHeader: the canonical header name
	hops    int    // sourceHops: 1 or more
	max     int    // sourceXFF, sourceForwarded, sourceHops: elements walked at most
}

// ipConfig collects the options before the constructor validates them.
type ipConfig struct {
	res        resolver
	keyer      ipKeyer
	sourceName string // the source option, for error messages; "" for none
	trustSet   bool
	maxSet     bool
}

// TrustProxies adds trusted proxy networks: forwarding headers are read
// only from a request whose TCP peer (Request.RemoteAddr) is inside one of
// them, and [FromXForwardedFor] and [FromForwarded] skip the addresses inside
// them. Each argument is a network in CIDR notation ("10.0.0.0/8",
// "2001:db8::/32") or a bare address, which is a /32 or /128 network.
// Several calls add up. By default no network is trusted: every header is
// ignored and the client is the TCP peer.
//
// IPv4 and IPv6 are distinct: "::/0" holds no IPv4 address. An IPv4-mapped
// network ("::ffff:10.0.0.0/104") is read as the IPv4 one ("10.0.0.0/8"),
// as addresses are. An argument that is neither a network nor an address,
// or that carries an IPv6 zone, is an error of the constructor, wrapping
// [ErrInvalidConfig] and naming the argument; so is a call without
// arguments.
func TrustProxies(cidrs ...string) IPOption {
	cidrs = slices.Clone(cidrs) // the caller may reuse its slice
	return IPOption{func(c *ipConfig) error {
		if len(cidrs) == 0 {
			return invalid("TrustProxies needs at least one network")
		}
		for _, s := range cidrs {
			p, ok := parseTrusted(s)
			if !ok {
				return invalid("TrustProxies %q is not an IP network (CIDR) or address", s)
			}
			c.res.trusted = append(c.res.trusted, p)
		}
		c.trustSet = true
		return nil
	}}
}

// parseTrusted reads a trusted network: a CIDR or a bare address, without
// zone, masked, with IPv4-mapped networks of /96 or longer unmapped.
func parseTrusted(s string) (netip.Prefix, bool) {
	var p netip.Prefix
	if strings.IndexByte(s, '/') >= 0 {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, false
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, false
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	p = p.Masked()
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p, true
}

// FromXForwardedFor makes X-Forwarded-For the source of the client address.
// All its field lines are read as one comma-separated list, in order, and
// walked from the right: each proxy appends the address it received the
// request from, so the right end is written by the proxies closest to this
// server and the left end by whoever sent the request first — possibly the
// client, who can write anything there. Addresses inside the trusted
// networks are skipped; the first address outside them is the client. When
// every address is trusted, the client is the leftmost one (so a client
// inside a trusted network can write its own key: trust only proxies).
//
// Empty elements and spaces or tabs around addresses are ignored. An element
// that is not an address (see [ClientIP] for the forms) ends the walk: the
// client is then the TCP peer; the walk never skips over such an element to
// the addresses left of it. It needs [TrustProxies]; see [ClientIP].
func FromXForwardedFor() IPOption {
	return source(sourceXFF, "FromXForwardedFor", func(*resolver) error { return nil })
}

// FromForwarded makes the RFC 7239 Forwarded header the source of the client
// address: the for= parameter of its elements, walked from the right like
// [FromXForwardedFor] — field lines merged in order, trusted addresses
// skipped, the first untrusted one is the client, or the leftmost when all
// are trusted.
//
// Values may be quoted (for="[2001:db8::1]:4711"), IPv6 addresses are in
// brackets, ports (also obfuscated ones, ":_port") are dropped, and
// parameter names are case-insensitive; an unquoted IPv6 address or port is
// accepted too. An element whose for= is "unknown" or an obfuscated
// identifier ("_hidden"), that has no for= or two, or that does not parse,
// ends the walk: the client is then the TCP peer. It needs [TrustProxies];
// see [ClientIP].
func FromForwarded() IPOption {
	return source(sourceForwarded, "FromForwarded", func(*resolver) error { return nil })
}

// FromHeader makes a header that holds one address the source of the client
// address: one that the trusted proxy sets, overwriting whatever the client
// sent, such as X-Real-IP (nginx), CF-Connecting-IP (Cloudflare),
// True-Client-IP (Akamai, Cloudflare), or Fly-Client-IP (Fly.io). Use it
// only when the proxy overwrites the header: one that passes the client's
// value through lets the client choose its key.
//
// The last field line is read, so that a proxy that adds its line after the
// client's rather than replacing it still wins. It must be one address, in
// the forms of [ClientIP] (spaces or tabs around it are ignored); anything
// else, such as a list, gives the TCP peer. The name is canonicalised. A
// name that is not a valid header field name, or that names
// X-Forwarded-For or Forwarded (use [FromXForwardedFor], [FromForwarded] or
// [TrustedHops]), is an error of the constructor. It needs [TrustProxies];
// see [ClientIP].
func FromHeader(name string) IPOption {
	return source(sourceHeader, fmt.Sprintf("FromHeader(%q)", name), func(res *resolver) error {
		if !validHeaderName(name) {
			return invalid("FromHeader name %q is not a valid header field name", name)
		}
		canon := http.CanonicalHeaderKey(name)
		if canon == headerXFF || canon == headerForwarded {
			return invalid("FromHeader(%q) reads one address; for a list use FromXForwardedFor, FromForwarded or TrustedHops", name)
		}
		res.header = canon
		return nil
	})
}

// TrustedHops makes X-Forwarded-For the source of the client address, read
// by position rather than by network: the client is the address n places
// from the right end of the list (field lines merged in order, empty
// elements ignored), counting the TCP peer as hop 0. Hop 1 is the rightmost
// address, written by the proxy that connects to this server; with one
// proxy in front, TrustedHops(1) is the client. With a CDN in front of a
// load balancer (client → CDN → load balancer → server), the load balancer
// is the peer, it appends the CDN's address (hop 1), the CDN appended the
// client's (hop 2): TrustedHops(2).
//
// Use it when the proxies' addresses change too often to list; they must
// each append exactly one address, or the count points at the wrong one.
// The trusted networks only decide whether the peer is a proxy whose
// headers are read: TrustProxies("0.0.0.0/0", "::/0") trusts any peer, for
// a server that only the proxies can reach. With fewer than n addresses, or
// an element that does not parse among the n, the client is the TCP peer.
//
// n must be at least 1 and at most the [MaxForwarded] cap; otherwise the
// constructor returns an error. It needs [TrustProxies]; see [ClientIP].
func TrustedHops(n int) IPOption {
	return source(sourceHops, fmt.Sprintf("TrustedHops(%d)", n), func(res *resolver) error {
		if n < 1 {
			return invalid("TrustedHops %d is less than 1 (hop 0 is the peer: use no source)", n)
		}
		res.hops = n
		return nil
	})
}

// source returns an IPOption that sets the source, refusing a second one.
func source(kind sourceKind, name string, set func(*resolver) error) IPOption {
	return IPOption{func(c *ipConfig) error {
		if c.sourceName != "" {
			return invalid("two sources, %s and %s: choose one", c.sourceName, name)
		}
		if err := set(&c.res); err != nil {
			return err
		}
		c.res.source, c.sourceName = kind, name
		return nil
	}}
}

// IPv6Prefix sets the prefix length that groups IPv6 clients into one key:
// 1 to 128, 64 by default. A client usually holds a whole /64 (or a /56 or
// /48 from some providers) and can pick a fresh address in it for every
// request. A length out of range is an error of the constructor.
func IPv6Prefix(bits int) IPOption {
	return IPOption{func(c *ipConfig) error {
		if bits < 1 || bits > 128 {
			return invalid("IPv6Prefix %d is outside [1, 128]", bits)
		}
		c.keyer.v6Bits = bits
		return nil
	}}
}

// IPv4Prefix sets the prefix length that groups IPv4 clients into one key:
// 1 to 32, 32 (each address on its own) by default. A length out of range is
// an error of the constructor.
func IPv4Prefix(bits int) IPOption {
	return IPOption{func(c *ipConfig) error {
		if bits < 1 || bits > 32 {
			return invalid("IPv4Prefix %d is outside [1, 32]", bits)
		}
		c.keyer.v4Bits = bits
		return nil
	}}
}

// MaxForwarded caps the elements walked in X-Forwarded-For or Forwarded:
// 1 to 256, [DefaultMaxForwarded] (20) by default. Empty elements do not
// count. The walk stops at the first untrusted address, so the cap is
// reached only by a chain of more than n trusted addresses, which no real
// chain of proxies is; the client is then the TCP peer, never an address
// further left. Whatever the cap, no more than the last 8 KiB of a header's
// field lines are read; an address that would be cut there also gives the
// peer. MaxForwarded needs [FromXForwardedFor], [FromForwarded] or
// [TrustedHops]; with another source, or none, it is an error of the
// constructor.
func MaxForwarded(n int) IPOption {
	return IPOption{func(c *ipConfig) error {
		if n < 1 || n > maxMaxForwarded {
			return invalid("MaxForwarded %d is outside [1, %d]", n, maxMaxForwarded)
		}
		c.res.max, c.maxSet = n, true
		return nil
	}}
}

// newIPConfig applies and validates opts for the constructor named who.
func newIPConfig(who string, opts []IPOption) (ipConfig, error) {
	c := ipConfig{
		res:   resolver{max: DefaultMaxForwarded},
		keyer: defaultIPKeyer,
	}
	for i, o := range opts {
		if o.apply == nil {
			return ipConfig{}, invalid("%s option %d is the zero IPOption", who, i)
		}
		if err := o.apply(&c); err != nil {
			return ipConfig{}, err
		}
	}
	list := c.res.source == sourceXFF || c.res.source == sourceForwarded || c.res.source == sourceHops
	switch {
	case c.maxSet && !list:
		return ipConfig{}, invalid("MaxForwarded needs FromXForwardedFor, FromForwarded or TrustedHops")
	case c.res.source == sourceHops && c.res.hops > c.res.max:
		return ipConfig{}, invalid("%s is more than MaxForwarded %d", c.sourceName, c.res.max)
	case c.res.source != sourcePeer && len(c.res.trusted) == 0:
		// It would never read its header: behind a load balancer, one bucket for all.
		return ipConfig{}, invalid("%s reads a header only proxies may write, but no proxy is trusted: "+
			"add TrustProxies with your load balancer's networks (TrustProxies(\"0.0.0.0/0\", \"::/0\") if every peer is one)", c.sourceName)
	}
	return c, nil
}

// ClientIP returns a KeyFunc that keys a request by its client's address,
// read from forwarding headers only when trusted proxies wrote them, in the
// keys of [PeerIP]: "ip:192.0.2.1", "ip:2001:db8:1:2::/64" (see [IPv4Prefix]
// and [IPv6Prefix] for the grouping).
//
// The client is found in this order:
//
//  1. The TCP peer, Request.RemoteAddr, in the forms PeerIP reads. If it
//     does not parse, the request has no key: an error wrapping [ErrNoKey].
//  2. If the peer is outside every network of [TrustProxies] (by default,
//     always), the peer is the client. Its headers are never read, so a
//     client that connects directly cannot change its key with them.
//  3. Otherwise the one configured source names the client:
//     [FromXForwardedFor], [FromForwarded], [FromHeader] or [TrustedHops].
//     A header that is missing, malformed, over-long, or names no usable
//     address gives the peer again — never the leftmost value of a header,
//     never an empty or shared key.
//
// Without a source the client is the peer, as with PeerIP (with the
// prefix lengths of the options). Trust is opt-in: a source without
// TrustProxies would never read its header — behind a load balancer every
// client in the balancer's bucket — so it is an error that says to name the
// balancer's networks. So are two sources, a malformed network, MaxForwarded
// without a list source, and options out of range: errors wrapping
// [ErrInvalidConfig] that name the option.
//
// Addresses in headers are read in the forms of RemoteAddr: "192.0.2.1",
// "192.0.2.1:port", "2001:db8::1", "[2001:db8::1]:port", with an IPv6 zone
// ("%eth0") dropped and an IPv4-mapped address (::ffff:192.0.2.1) read as
// IPv4 before any network test or grouping. Ambiguous forms, such as IPv4
// with leading zeros ("010.1.1.1", octal to some parsers) or with fewer than
// four parts, are not addresses.
//
// If [ClientIPMiddleware], built with the same TrustProxies, source and
// MaxForwarded, has already resolved the request, the KeyFunc uses the
// address it stored rather than resolving again. The KeyFunc is safe for
// concurrent use. It records the address it resolves in the request's
// address slot, if any ([WithAddressSlot]).
func ClientIP(opts ...IPOption) (KeyFunc, error) {
	c, err := newIPConfig("ClientIP", opts)
	if err != nil {
		return nil, err
	}
	res, k := &c.res, c.keyer
	return func(r *http.Request) (string, error) {
		if v, ok := r.Context().Value(clientAddrKey{}).(*clientAddrValue); ok && v.res.sameAs(res) {
			record(r, v.addr)
			return k.key(v.addr), nil
		}
		addr, ok := res.resolve(r)
		if !ok {
			return "", badRemoteAddr(r.RemoteAddr)
		}
		record(r, addr)
		return k.key(addr), nil
	}, nil
}

// ClientIPMiddleware returns middleware that resolves each request's client
// address as [ClientIP] does and stores it in the request's context, for
// handlers to read with [ClientAddr] and for a ClientIP KeyFunc built with
// the same options to reuse. The address is whole (not grouped: IPv4Prefix
// and IPv6Prefix, accepted so that one list of options can serve both, do
// not apply), without zone, and unmapped. Request.RemoteAddr and the headers
// are left as they are. A request whose RemoteAddr does not parse goes on
// without an address in its context.
//
// The options and their errors are those of ClientIP. The middleware is
// safe for concurrent use.
func ClientIPMiddleware(opts ...IPOption) (func(http.Handler) http.Handler, error) {
	c, err := newIPConfig("ClientIPMiddleware", opts)
	if err != nil {
		return nil, err
	}
	res := &c.res
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if addr, ok := res.resolve(r); ok {
				r = r.WithContext(context.WithValue(r.Context(), clientAddrKey{}, &clientAddrValue{addr, res}))
			}
			next.ServeHTTP(w, r)
		})
	}, nil
}

type clientAddrKey struct{}

// clientAddrValue is what ClientIPMiddleware stores: the address and the
// resolver that found it, so that a KeyFunc reuses only what its own
// configuration would have found.
type clientAddrValue struct {
	addr netip.Addr
	res  *resolver
}

// ClientAddr returns the client address that [ClientIPMiddleware] stored in
// ctx: whole, without zone, IPv4-mapped addresses as IPv4. It returns false
// when ctx holds none, such as outside that middleware or for a request
// whose RemoteAddr did not parse.
func ClientAddr(ctx context.Context) (netip.Addr, bool) {
	v, ok := ctx.Value(clientAddrKey{}).(*clientAddrValue)
	if !ok {
		return netip.Addr{}, false
	}
	return v.addr, true
}

// ClientIPFromContext returns a KeyFunc that keys a request by the client
// address that fn reads from its context, for apps that resolve it
// upstream, such as with chi's middleware.ClientIPFromXFF and
// middleware.GetClientIP (chi v5.3 and later):
//
//	kf, err := keyfuncs.ClientIPFromContext(middleware.GetClientIP)
//
// The address is read in the forms of [ClientIP] (port, brackets and zone
// dropped, IPv4-mapped addresses as IPv4) and keyed as ClientIP keys it.
// Only [IPv4Prefix] and [IPv6Prefix] apply: other options are errors
// wrapping [ErrInvalidConfig], because the trust decision is fn's. fn
// returning "" or a string that is not an address is an error wrapping
// [ErrNoKey], never a shared key. A nil fn is an error wrapping
// ErrInvalidConfig. The KeyFunc is as safe for concurrent use as fn; it
// records the address in the request's address slot, if any
// ([WithAddressSlot]).
func ClientIPFromContext(fn func(ctx context.Context) string, opts ...IPOption) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("ClientIPFromContext function is nil")
	}
	c, err := newIPConfig("ClientIPFromContext", opts)
	if err != nil {
		return nil, err
	}
	if c.trustSet || c.sourceName != "" || c.maxSet {
		return nil, invalid("ClientIPFromContext takes only IPv4Prefix and IPv6Prefix: the function decides whom to trust")
	}
	k := c.keyer
	return func(r *http.Request) (string, error) {
		s := fn(r.Context())
		if s == "" {
			return "", errNoClientIP
		}
		addr, ok := parseAddr(s)
		if !ok {
			if len(s) > 64 {
				s = s[:64] + "..."
			}
			return "", fmt.Errorf("keyfuncs: %w: client IP %q from the context is not an IP address", ErrNoKey, s)
		}
		record(r, addr)
		return k.key(addr), nil
	}, nil
}

var errNoClientIP = fmt.Errorf("keyfuncs: %w: no client IP in the request context", ErrNoKey)

// sameAs reports whether res and o resolve every request alike (the prefix
// lengths of keys are not theirs).
func (res *resolver) sameAs(o *resolver) bool {
	if res == o {
		return true
	}
	return res.source == o.source && res.header == o.header && res.hops == o.hops &&
		res.max == o.max && slices.Equal(res.trusted, o.trusted)
}

// isTrusted reports whether addr (unmapped, without zone) is inside a
// trusted network.
func (res *resolver) isTrusted(addr netip.Addr) bool {
	for _, p := range res.trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// resolve returns the client address of r, or false when RemoteAddr does
// not parse. It does not allocate.
func (res *resolver) resolve(r *http.Request) (netip.Addr, bool) {
	peer, ok := parseAddr(r.RemoteAddr)
	if !ok {
		return netip.Addr{}, false
	}
	if res.source == sourcePeer || !res.isTrusted(peer) {
		return peer, true
	}
	switch res.source {
	case sourceXFF, sourceHops:
		return res.walk(r.Header[headerXFF], peer), true
	case sourceForwarded:
		return res.walk(r.Header[headerForwarded], peer), true
	default: // sourceHeader
		return res.single(r.Header[res.header], peer), true
	}
}

// single returns the one address of the last field line, or peer.
func (res *resolver) single(lines []string, peer netip.Addr) netip.Addr {
	if len(lines) == 0 {
		return peer
	}
	v := lines[len(lines)-1]
	if len(v) > maxForwardedBytes {
		return peer
	}
	if addr, ok := parseAddr(trimOWS(v)); ok {
		return addr
	}
	return peer
}

// walk returns the client address named by the forwarding header whose
// field lines are lines, read from the right end (see FromXForwardedFor,
// FromForwarded and TrustedHops), or peer when the header names none.
//
// It reads at most maxForwardedBytes from the right end of the lines, as a
// window: an element that reaches the window's left edge may have been
// cut (cutting "11.2.3.4" leaves "1.2.3.4"), so meeting one ends the walk
// with the peer.
func (res *resolver) walk(lines []string, peer netip.Addr) netip.Addr {
	forwarded := res.source == sourceForwarded
	budget := maxForwardedBytes
	n := 0       // elements examined
	last := peer // the last address examined: the client when all are trusted
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		cut := len(line) > budget
		if cut {
			line = line[len(line)-budget:]
		}
		budget -= len(line)
		for {
			var j int      // the comma before the last element, or -1
			var plain bool // the element holds only digits, dots and OWS
			if forwarded {
				var ok bool
				if j, ok = lastElementComma(line); !ok {
					return peer // an unterminated quoted string
				}
			} else {
				j, plain = lastListComma(line)
			}
			if j < 0 && cut {
				return peer
			}
			elem := trimOWS(line[j+1:])
			if elem != "" {
				n++
				if n > res.max {
					return peer
				}
				var addr netip.Addr
				var ok bool
				switch {
				case forwarded:
					addr, ok = forwardedFor(elem)
				case plain:
					// An IPv4 address, the commonest element, or garbage
					// that netip refuses: nothing to split or cut.
					var err error
					addr, err = netip.ParseAddr(elem)
					ok = err == nil
				default:
					addr, ok = parseAddr(elem)
				}
				if !ok {
					return peer
				}
				if res.source == sourceHops {
					if n == res.hops {
						return addr
					}
				} else if !res.isTrusted(addr) {
					return addr
				}
				last = addr
			}
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
	if res.source == sourceHops {
		return peer // fewer than hops addresses
	}
	return last
}

// lastListComma returns the index of the last comma of s, or -1, and
// whether the text after it holds only digits, dots, spaces and tabs: one
// pass where strings.LastIndexByte, then a check of the element, would
// take two.
func lastListComma(s string) (j int, plain bool) {
	plain = true
	for i := len(s) - 1; i >= 0; i-- {
		switch c := s[i]; {
		case c == ',':
			return i, plain
		case (c < '0' || c > '9') && c != '.' && c != ' ' && c != '\t':
			plain = false
		}
	}
	return -1, plain
}

// trimOWS trims the spaces and tabs around s.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// lastElementComma returns the index of the last comma of a Forwarded field
// line that is outside quoted strings, or -1, scanning from the right; ok is
// false when a quoted string is left open. Inside a quoted string, a quote
// after an odd run of backslashes is escaped. Scanning from the right keeps
// the elements that trusted proxies appended intact whatever the client put
// on the left, such as an unterminated quote.
func lastElementComma(s string) (j int, ok bool) {
	quoted := false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			if quoted {
				k := i
				for k > 0 && s[k-1] == '\\' {
					k--
				}
				if (i-k)%2 == 1 {
					i = k // an escaped quote: skip it and its backslashes
					continue
				}
			}
			quoted = !quoted
		case ',':
			if !quoted {
				return i, true
			}
		}
	}
	return -1, !quoted
}

// forwardedFor returns the address in the for= parameter of one Forwarded
// element (pairs "name=value" separated by ';', values tokens or quoted
// strings). It fails for an element without for= or with two, one that
// does not parse, and a for= node that is "unknown", obfuscated, or not an
// address.
func forwardedFor(elem string) (netip.Addr, bool) {
	var node string
	found := false
	for i := 0; i < len(elem); {
		if c := elem[i]; c == ' ' || c == '\t' || c == ';' {
			i++
			continue
		}
		start := i
		for i < len(elem) && isTokenChar(elem[i]) {
			i++
		}
		if i == start || i == len(elem) || elem[i] != '=' {
			return netip.Addr{}, false
		}
		name := elem[start:i]
		i++ // '='
		var value string
		if i < len(elem) && elem[i] == '"' {
			i++
			vs := i
			for i < len(elem) && elem[i] != '"' {
				if elem[i] == '\\' {
					i++ // quoted-pair; a node never holds one, parseNode refuses it
				}
				i++
			}
			if i >= len(elem) {
				return netip.Addr{}, false // unterminated
			}
			value = elem[vs:i]
			i++ // closing quote
		} else {
			vs := i
			// A token; ':' and brackets too, for senders that forget to
			// quote an IPv6 address or a port.
			for i < len(elem) && (isTokenChar(elem[i]) || elem[i] == ':' || elem[i] == '[' || elem[i] == ']') {
				i++
			}
			value = elem[vs:i]
			if value == "" {
				return netip.Addr{}, false
			}
		}
		for i < len(elem) && (elem[i] == ' ' || elem[i] == '\t') {
			i++
		}
		if i < len(elem) && elem[i] != ';' {
			return netip.Addr{}, false
		}
		if len(name) == 3 && strings.EqualFold(name, "for") {
			if found {
				return netip.Addr{}, false // RFC 7239: a parameter occurs once per element
			}
			node, found = value, true
		}
	}
	if !found {
		return netip.Addr{}, false
	}
	return parseNode(node)
}

// parseNode reads an RFC 7239 node: an address with an optional port,
// IPv6 in brackets. "unknown" and obfuscated identifiers ("_hidden") name
// no address; an obfuscated port (":_p") is dropped like a numeric one.
func parseNode(v string) (netip.Addr, bool) {
	if v == "" || v[0] == '_' || strings.EqualFold(v, "unknown") {
		return netip.Addr{}, false
	}
	if i := strings.LastIndexByte(v, ':'); i >= 0 && i+1 < len(v) && v[i+1] == '_' {
		host := v[:i]
		if !validObfuscated(v[i+1:]) || !(strings.HasSuffix(host, "]") || strings.IndexByte(host, ':') < 0) {
			return netip.Addr{}, false
		}
		v = host
	}
	return parseAddr(v)
}

// validObfuscated reports whether s is an RFC 7239 obfuscated identifier:
// '_' and then one or more of ALPHA, DIGIT, '.', '_', '-'.
func validObfuscated(s string) bool {
	if len(s) < 2 || s[0] != '_' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// isTokenChar reports whether c may appear in an RFC 9110 token.
func isTokenChar(c byte) bool {
	return c > ' ' && c < 0x7f && !isSeparator(c)
}
