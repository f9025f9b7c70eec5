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

// TrustProxies adds trusted proxy networks, in CIDR notation ("10.0.0.0/8")
// or as bare addresses: forwarding headers are read only from a request whose
// TCP peer is inside one, and [FromXForwardedFor] and [FromForwarded] skip
// the addresses inside them. Calls add up; by default no network is trusted
// and the client is the peer. IPv4 and IPv6 are distinct ("::/0" holds no
// IPv4 address); an IPv4-mapped network is read as the IPv4 one. No
// argument, or one that is not a network or carries a zone, is an error of
// the constructor.
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

// FromXForwardedFor reads the client from X-Forwarded-For, all field lines
// as one list, walked from the right end (written by the proxies nearest
// this server; the left end is whatever the client sent): trusted addresses
// are skipped and the first other one is the client, or the leftmost if all
// are trusted. Empty elements and spaces around addresses are ignored; an
// element that is not an address ends the walk with the peer. It needs
// [TrustProxies].
func FromXForwardedFor() IPOption {
	return source(sourceXFF, "FromXForwardedFor", func(*resolver) error { return nil })
}

// FromForwarded reads the client from the for= parameters of the RFC 7239
// Forwarded header, walked as [FromXForwardedFor] walks. Quoted values, IPv6
// in brackets, ports (also obfuscated ":_p") and case-insensitive names are
// read; an element whose for= is "unknown" or obfuscated, that has no for=
// or two, or does not parse, ends the walk with the peer. It needs
// [TrustProxies].
func FromForwarded() IPOption {
	return source(sourceForwarded, "FromForwarded", func(*resolver) error { return nil })
}

// FromHeader reads the client from a header holding one address that the
// trusted proxy overwrites, such as X-Real-IP (nginx), CF-Connecting-IP or
// True-Client-IP; one that passes the client's value through lets the client
// choose its key. The last field line is read; anything but one address gives
// the peer. An invalid name, or X-Forwarded-For or Forwarded (which are
// lists), is an error of the constructor. It needs [TrustProxies].
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

// TrustedHops reads the client from X-Forwarded-For by position: the address
// n places from the right end, the peer being hop 0. With one proxy in front,
// TrustedHops(1); with a CDN in front of a load balancer, TrustedHops(2).
// For proxies whose addresses change too often to list; each must append
// exactly one address. The trusted networks decide only whether the peer's
// headers are read (TrustProxies("0.0.0.0/0", "::/0") for a server only
// the proxies can reach). Fewer than n addresses, or one that does not parse,
// gives the peer. n must be within [1, MaxForwarded]. It needs [TrustProxies].
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
// 1 to 128, 64 by default (a client can pick a fresh address in its /64 for
// every request; some providers hand out /56 or /48).
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
// 1 to 32, 32 by default.
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
// 1 to 256, [DefaultMaxForwarded] by default; a longer chain of trusted
// addresses gives the peer, as does an address cut at the 8 KiB of a header
// that are read at most. It needs a list source (FromXForwardedFor,
// FromForwarded, TrustedHops).
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

// ClientIP returns a KeyFunc that keys a request by its client's address, in
// the keys of [PeerIP] ("ip:192.0.2.1", "ip:2001:db8:1:2::/64"). The client
// is the TCP peer (no key if RemoteAddr does not parse: [ErrNoKey]), unless
// the peer is inside a network of [TrustProxies]: then the one source
// ([FromXForwardedFor], [FromForwarded], [FromHeader] or [TrustedHops])
// names it, and a header that is missing, malformed or over-long gives the
// peer again, never a shared key.
//
// A source without TrustProxies would never read its header (behind a load
// balancer, one bucket for all), so it is an error saying what to add; so
// are two sources and options out of range (errors wrap [ErrInvalidConfig]).
// Addresses are read as RemoteAddr is ("192.0.2.1", "[2001:db8::1]:port"),
// zones dropped and IPv4-mapped ones as IPv4; ambiguous forms ("010.1.1.1")
// are not addresses. A request that [ClientIPMiddleware] resolved with the
// same options is not resolved again. The address is recorded in the
// request's address slot, if any ([WithAddressSlot]).
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
			return "", errNotAnAddr(r.RemoteAddr)
		}
		record(r, addr)
		return k.key(addr), nil
	}, nil
}

// ClientIPMiddleware returns middleware that resolves each request's client
// address as [ClientIP] does, with its options, and stores it, whole, in the
// request's context for [ClientAddr] and for a ClientIP of the same options.
// RemoteAddr and the headers are left as they are.
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
// ctx (whole, without zone, IPv4-mapped as IPv4), or false.
func ClientAddr(ctx context.Context) (netip.Addr, bool) {
	v, ok := ctx.Value(clientAddrKey{}).(*clientAddrValue)
	if !ok {
		return netip.Addr{}, false
	}
	return v.addr, true
}

// ClientIPFromContext returns a KeyFunc that keys a request, as [ClientIP]
// keys it, by the address fn reads from its context, for apps that resolve it
// upstream, such as with chi's middleware.GetClientIP (chi v5.3 and later):
//
//	kf, err := keyfuncs.ClientIPFromContext(middleware.GetClientIP)
//
// Only [IPv4Prefix] and [IPv6Prefix] apply: whom to trust is fn's decision.
// fn returning "" or no address is an error wrapping [ErrNoKey]. The address
// is recorded in the request's address slot, if any ([WithAddressSlot]).
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
			return "", fmt.Errorf("keyfuncs: %w: client IP %q from the context is not an IP address", ErrNoKey, clip(s))
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

// walk returns the client address that the forwarding header's field lines
// name, read from the right end, or peer. It reads at most maxForwardedBytes
// from the right: an element that reaches that window's edge may have been
// cut ("11.2.3.4" leaves "1.2.3.4"), so it gives the peer.
func (res *resolver) walk(lines []string, peer netip.Addr) netip.Addr {
	forwarded, parse := res.source == sourceForwarded, parseAddr
	if forwarded {
		parse = forwardedFor
	}
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
			j := strings.LastIndexByte(line, ',') // the comma before the last element, or -1
			if forwarded {
				var ok bool
				if j, ok = lastElementComma(line); !ok {
					return peer // an unterminated quoted string
				}
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
				addr, ok := parse(elem)
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

// lastElementComma returns the index of the last comma of a Forwarded line
// outside quoted strings (a quote after an odd run of backslashes is
// escaped), or -1, scanning from the right so that whatever the client put on
// the left cannot hide the proxies' elements; ok is false for an open quote.
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

// forwardedFor returns the address of one Forwarded element's for= parameter
// (pairs "name=value" separated by ';', values tokens or quoted strings); it
// fails without for= or with two, and for a node that is no address.
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
