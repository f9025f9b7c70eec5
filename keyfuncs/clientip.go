package keyfuncs

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// DefaultMaxForwarded is how many elements of X-Forwarded-For or Forwarded
// [ClientIP] walks unless [MaxForwarded] says otherwise.
const DefaultMaxForwarded = 20

const (
	maxForwardedBytes = 8 << 10 // read of a forwarding header, from the right
	headerXFF         = "X-Forwarded-For"
	headerForwarded   = "Forwarded"
)

// An IPOption configures [ClientIP], [ClientIPMiddleware] or
// [ClientIPFromContext]; the zero IPOption is invalid.
type IPOption struct {
	apply func(*ipConfig) error
}

// ipConfig finds the client address of a request and keys it; immutable once built.
type ipConfig struct {
	trusted []netip.Prefix // masked; IPv4-mapped networks unmapped
	unix    bool           // a peer on a Unix socket is trusted
	header  string         // the source's header; "" for none (the peer)
	single  bool           // header holds one address, not a list
	hops    int            // > 0: the client is hop n of X-Forwarded-For
	max     int            // list elements walked at most
	maxSet  bool
	source  string // the source's option, for error messages; "" for none
	keyer   ipKeyer
}

// TrustProxies adds one or more trusted proxy networks, CIDRs or bare
// addresses without zone: headers are read only from a TCP peer inside one,
// and [FromXForwardedFor] and [FromForwarded] skip the addresses inside them.
// Calls add up; none is trusted by default. IPv4 and IPv6 are distinct
// ("::/0" holds no IPv4 address); IPv4-mapped networks (/96 or longer) are
// read as IPv4. A client inside a trusted network can choose its key (with
// those two sources, trusting every address, /0, is an error). "unix" trusts
// a peer on a Unix socket (RemoteAddr "@", "" or a path), as nginx on the
// same host: having no address, it is no request's key.
func TrustProxies(cidrs ...string) IPOption {
	cidrs = slices.Clone(cidrs) // the caller may reuse its slice
	return IPOption{func(c *ipConfig) error {
		if len(cidrs) == 0 {
			return invalid("TrustProxies needs at least one network")
		}
		for _, s := range cidrs {
			if s == "unix" {
				c.unix = true
				continue
			}
			p, err := netip.ParsePrefix(s)
			if a, aerr := netip.ParseAddr(s); aerr == nil && a.Zone() == "" {
				p, err = netip.PrefixFrom(a, a.BitLen()), nil // a bare address
			}
			if err != nil {
				return invalid("TrustProxies %q is not an IP network (CIDR) or address", s)
			}
			if a := p.Addr(); a.Is4In6() && p.Bits() < 96 {
				return invalid("TrustProxies %q: an IPv4-mapped network shorter than /96 holds no IPv4 address", s)
			} else if a.Is4In6() {
				p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
			}
			c.trusted = append(c.trusted, p.Masked())
		}
		return nil
	}}
}

// FromXForwardedFor reads the client from X-Forwarded-For, its field lines
// as one list walked from the right, the end your proxies wrote (the left is
// whatever the client chose): the first address not trusted is the client, or
// the leftmost if all are. Empty elements and spaces are ignored; an element
// that is not an address gives the peer.
func FromXForwardedFor() IPOption {
	return source("FromXForwardedFor", ipConfig{header: headerXFF}, nil)
}

// FromForwarded reads the client from the for= parameters of RFC 7239
// Forwarded, walked as [FromXForwardedFor] walks; quoted values, ports (also
// obfuscated, ":_p") and names in any case are read. A for= that is
// "unknown", obfuscated, missing, repeated or malformed gives the peer.
func FromForwarded() IPOption {
	return source("FromForwarded", ipConfig{header: headerForwarded}, nil)
}

// FromHeader reads the client from the last field line of a header of one
// address that the proxy overwrites, such as X-Real-IP (one it passes through
// lets the client choose its key), or the peer if that is not one address.
// The list headers X-Forwarded-For and Forwarded are invalid here.
func FromHeader(name string) IPOption {
	canon := http.CanonicalHeaderKey(name)
	var err error
	if !validHeaderName(name) {
		err = invalid("FromHeader name %q is not a valid header field name", name)
	} else if canon == headerXFF || canon == headerForwarded {
		err = invalid("FromHeader(%q) reads one address; for a list use FromXForwardedFor, FromForwarded or TrustedHops", name)
	}
	return source(fmt.Sprintf("FromHeader(%q)", name), ipConfig{header: canon, single: true}, err)
}

// TrustedHops reads the client from X-Forwarded-For by position, for proxies
// that cannot be listed and each append one address: the address n (1 to
// [MaxForwarded]) places from the right, the peer being hop 0, or the peer if
// fewer or malformed. [TrustProxies] only says whose headers are read.
func TrustedHops(n int) IPOption {
	var err error
	if n < 1 {
		err = invalid("TrustedHops %d is less than 1 (hop 0 is the peer: use no source)", n)
	}
	return source(fmt.Sprintf("TrustedHops(%d)", n), ipConfig{header: headerXFF, hops: n}, err)
}

// source returns an IPOption that sets the source of s, or fails with err.
func source(name string, s ipConfig, err error) IPOption {
	return IPOption{func(c *ipConfig) error {
		if c.source != "" {
			return invalid("two sources, %s and %s: choose one", c.source, name)
		}
		c.header, c.single, c.hops, c.source = s.header, s.single, s.hops, name
		return err
	}}
}

// IPv6Prefix sets the prefix length that groups IPv6 clients into one key:
// 1 to 128, 64 by default, as a client may use any address of its /64 (some
// providers hand a client a /56 or /48).
func IPv6Prefix(bits int) IPOption {
	return rangeOption("IPv6Prefix", bits, 128, func(c *ipConfig) { c.keyer.v6Bits = bits })
}

// IPv4Prefix sets the prefix length that groups IPv4 clients into one key:
// 1 to 32, 32 by default.
func IPv4Prefix(bits int) IPOption {
	return rangeOption("IPv4Prefix", bits, 32, func(c *ipConfig) { c.keyer.v4Bits = bits })
}

// MaxForwarded caps the elements walked by [FromXForwardedFor], [FromForwarded]
// or [TrustedHops], which it needs: 1 to 256, [DefaultMaxForwarded] by default.
// A longer chain, or an element cut at the 8 KiB read of a header, gives the peer.
func MaxForwarded(n int) IPOption {
	return rangeOption("MaxForwarded", n, 256, func(c *ipConfig) { c.max, c.maxSet = n, true })
}

func rangeOption(name string, n, max int, set func(*ipConfig)) IPOption {
	return IPOption{func(c *ipConfig) error {
		if n < 1 || n > max {
			return invalid("%s %d is outside [1, %d]", name, n, max)
		}
		set(c)
		return nil
	}}
}

// newIPConfig applies and validates opts for the constructor named who.
func newIPConfig(who string, opts []IPOption) (*ipConfig, error) {
	c := &ipConfig{max: DefaultMaxForwarded, keyer: defaultIPKeyer}
	for i, o := range opts {
		if o.apply == nil {
			return nil, invalid("%s option %d is the zero IPOption", who, i)
		}
		if err := o.apply(c); err != nil {
			return nil, err
		}
	}
	walks := c.header != "" && !c.single && c.hops == 0 // FromXForwardedFor, FromForwarded
	switch {
	case c.maxSet && (c.header == "" || c.single):
		return nil, invalid("MaxForwarded needs FromXForwardedFor, FromForwarded or TrustedHops")
	case c.hops > c.max:
		return nil, invalid("%s is more than MaxForwarded %d", c.source, c.max)
	case c.header != "" && len(c.trusted) == 0 && !c.unix: // one bucket for all behind a load balancer
		return nil, invalid("%s reads a header only proxies may write, but no proxy is trusted: add TrustProxies "+
			"with your proxies' networks (if they cannot be listed: TrustedHops(n), or a FromHeader they all overwrite)", c.source)
	case c.header == "" && (len(c.trusted) > 0 || c.unix) && who != "ClientIPFromContext": // PeerIP, by accident
		return nil, invalid("TrustProxies without a source reads no header, so every client behind a trusted proxy " +
			"would share its bucket: add FromXForwardedFor, FromForwarded, FromHeader or TrustedHops")
	case walks && slices.ContainsFunc(c.trusted, func(p netip.Prefix) bool { return p.Bits() == 0 }):
		return nil, invalid("%s with a trusted network of every address (/0): the walk would end at "+
			"the leftmost element, which the client writes; list your proxies' networks, or use TrustedHops(n)", c.source)
	}
	return c, nil
}

// ClientIP returns a KeyFunc that keys a request as [PeerIP] does, by the TCP
// peer or, if it is in [TrustProxies], by the address that its one source
// ([FromXForwardedFor], [FromForwarded], [FromHeader], [TrustedHops]) names,
// or else the peer; a source without TrustProxies, or the reverse, is
// invalid. It reuses what a [ClientIPMiddleware] of the same options stored,
// and records the address in the request's [WithAddressSlot].
func ClientIP(opts ...IPOption) (KeyFunc, error) {
	c, err := newIPConfig("ClientIP", opts)
	if err != nil {
		return nil, err
	}
	return func(r *http.Request) (string, error) {
		var addr netip.Addr
		if v, ok := r.Context().Value(clientAddrKey{}).(*clientAddrValue); ok && v.c.sameAs(c) {
			addr = v.addr
		} else if addr, ok = c.resolve(r); !ok {
			return "", errNotAnAddr(r.RemoteAddr)
		}
		return c.keyer.key(r, addr), nil
	}, nil
}

// ClientIPMiddleware returns middleware that resolves each request's client
// address as [ClientIP] does and stores it, whole, in the context for
// [ClientAddr] and ClientIP; RemoteAddr and the headers are left as they are.
func ClientIPMiddleware(opts ...IPOption) (func(http.Handler) http.Handler, error) {
	c, err := newIPConfig("ClientIPMiddleware", opts)
	if err != nil {
		return nil, err
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if addr, ok := c.resolve(r); ok {
				r = r.WithContext(context.WithValue(r.Context(), clientAddrKey{}, &clientAddrValue{addr, c}))
			}
			next.ServeHTTP(w, r)
		})
	}, nil
}

type clientAddrKey struct{}

// clientAddrValue holds the ipConfig that found addr: ClientIP reuses only its own.
type clientAddrValue struct {
	addr netip.Addr
	c    *ipConfig
}

// ClientAddr returns the client address that [ClientIPMiddleware] stored in
// ctx (whole, without zone, IPv4-mapped as IPv4), or false.
func ClientAddr(ctx context.Context) (netip.Addr, bool) {
	if v, ok := ctx.Value(clientAddrKey{}).(*clientAddrValue); ok {
		return v.addr, true
	}
	return netip.Addr{}, false
}

// ClientIPFromContext returns a KeyFunc that keys a request as [ClientIP]
// does, by the address fn reads from its context, such as chi's
// middleware.GetClientIP (chi v5.3 and later). fn decides whom to trust, so
// options other than [IPv4Prefix] and [IPv6Prefix] are invalid.
func ClientIPFromContext(fn func(ctx context.Context) string, opts ...IPOption) (KeyFunc, error) {
	if fn == nil {
		return nil, invalid("ClientIPFromContext function is nil")
	}
	c, err := newIPConfig("ClientIPFromContext", opts)
	if err != nil {
		return nil, err
	}
	if len(c.trusted) > 0 || c.unix || c.source != "" { // MaxForwarded needs a source
		return nil, invalid("ClientIPFromContext takes only IPv4Prefix and IPv6Prefix: the function decides whom to trust")
	}
	return func(r *http.Request) (string, error) {
		s := fn(r.Context())
		if s == "" {
			return "", errNoClientIP
		}
		addr, ok := parseAddr(s)
		if !ok {
			return "", fmt.Errorf("keyfuncs: %w: client IP %q from the context is not an IP address", ErrNoKey, clip(s))
		}
		return c.keyer.key(r, addr), nil
	}, nil
}

var errNoClientIP = fmt.Errorf("keyfuncs: %w: no client IP in the request context", ErrNoKey)

// sameAs reports whether c and o resolve every request alike.
func (c *ipConfig) sameAs(o *ipConfig) bool {
	return c == o || c.header == o.header && c.single == o.single && c.hops == o.hops &&
		c.max == o.max && c.unix == o.unix && slices.Equal(c.trusted, o.trusted)
}

func (c *ipConfig) isTrusted(addr netip.Addr) bool {
	return slices.ContainsFunc(c.trusted, func(p netip.Prefix) bool { return p.Contains(addr) })
}

// resolve returns the client address of r, or false if it has none (as a Unix socket peer).
func (c *ipConfig) resolve(r *http.Request) (netip.Addr, bool) {
	peer, ok := parseAddr(r.RemoteAddr)
	unix := c.unix && (r.RemoteAddr == "" || r.RemoteAddr[0] == '@' || r.RemoteAddr[0] == '/')
	if c.header == "" || !unix && (!ok || !c.isTrusted(peer)) {
		return peer, ok
	}
	lines := r.Header[c.header]
	if !c.single {
		addr := c.walk(lines, peer)
		return addr, addr.IsValid()
	}
	// The last field line is the one the proxy wrote.
	if n := len(lines); n > 0 && len(lines[n-1]) <= maxForwardedBytes {
		if addr, ok := parseAddr(trimOWS(lines[n-1])); ok {
			return addr, true
		}
	}
	return peer, ok
}

// walk returns the address that a list header's lines name, or peer; so does an
// element at the edge of the read, which may be cut ("11.2.3.4" to "1.2.3.4").
func (c *ipConfig) walk(lines []string, peer netip.Addr) netip.Addr {
	lastComma, parse := lastListComma, parseAddr
	if c.header == headerForwarded {
		lastComma, parse = lastElementComma, forwardedFor
	}
	budget := maxForwardedBytes
	n := 0       // elements examined
	last := peer // the last address examined: the client when all are trusted
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i][max(0, len(lines[i])-budget):]
		cut := len(line) < len(lines[i])
		budget -= len(line)
		for {
			j, ok := lastComma(line) // the comma before the last element, or -1
			if !ok || j < 0 && cut {
				return peer // an open quoted string, or a cut element
			}
			if elem := trimOWS(line[j+1:]); elem != "" {
				if n++; n > c.max {
					return peer
				}
				addr, ok := parse(elem)
				switch {
				case !ok:
					return peer
				case c.hops > 0 && n == c.hops, c.hops == 0 && !c.isTrusted(addr):
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
	if c.hops > 0 {
		return peer // fewer than hops addresses
	}
	return last
}

func lastListComma(s string) (int, bool) { return strings.LastIndexByte(s, ','), true }

// lastElementComma returns the index of the last comma of a Forwarded line
// outside quoted strings, or -1; ok is false for an open quote. It scans from
// the right: what the client wrote on the left cannot hide the proxies' part.
func lastElementComma(s string) (j int, ok bool) {
	quoted := false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			k := i
			for quoted && k > 0 && s[k-1] == '\\' {
				k--
			}
			if (i-k)%2 == 0 {
				quoted = !quoted // not escaped
			}
			i = k // skip the backslashes
		case ',':
			if !quoted {
				return i, true
			}
		}
	}
	return -1, !quoted
}

// forwardedFor returns the for= address of a Forwarded element (name=value;...).
func forwardedFor(elem string) (netip.Addr, bool) {
	node, found := "", false
	for s := elem; ; {
		s = s[span(s, func(c byte) bool { return isOWS(c) || c == ';' }):]
		if s == "" {
			break
		}
		i := span(s, isTokenChar)
		if i == 0 || i == len(s) || s[i] != '=' {
			return netip.Addr{}, false
		}
		name, value := s[:i], ""
		s = s[i+1:]
		if strings.HasPrefix(s, `"`) {
			for i = 1; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' {
					i++ // a quoted pair
				}
			}
			if i >= len(s) {
				return netip.Addr{}, false // unterminated
			}
			value, s = s[1:i], s[i+1:]
		} else {
			// A token, or ':' and brackets that senders forget to quote.
			i = span(s, func(c byte) bool { return isTokenChar(c) || c == ':' || c == '[' || c == ']' })
			if i == 0 {
				return netip.Addr{}, false
			}
			value, s = s[:i], s[i:]
		}
		if s = s[span(s, isOWS):]; s != "" && s[0] != ';' {
			return netip.Addr{}, false
		}
		if strings.EqualFold(name, "for") {
			if found {
				return netip.Addr{}, false // RFC 7239: a parameter occurs once per element
			}
			node, found = value, true
		}
	}
	// Drop an obfuscated port (":_p"); "unknown" and "_hidden" fail to parse.
	if i := strings.LastIndexByte(node, ':'); i >= 0 && strings.HasPrefix(node[i+1:], "_") {
		host, port := node[:i], node[i+1:]
		if len(port) < 2 || span(port[1:], isObfuscatedChar) != len(port)-1 ||
			strings.Contains(host, ":") && !strings.HasSuffix(host, "]") {
			return netip.Addr{}, false
		}
		node = host
	}
	return parseAddr(node)
}

// isObfuscatedChar reports whether c may follow the '_' of an obfuscated port.
func isObfuscatedChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
}

func isOWS(c byte) bool { return c == ' ' || c == '\t' }

// trimOWS trims spaces and tabs: strings.Trim takes 5 times as long per element.
func trimOWS(s string) string {
	s = s[span(s, isOWS):]
	for len(s) > 0 && isOWS(s[len(s)-1]) {
		s = s[:len(s)-1]
	}
	return s
}

// span returns the length of the longest prefix of s whose bytes satisfy ok.
func span(s string, ok func(byte) bool) int {
	i := 0
	for i < len(s) && ok(s[i]) {
		i++
	}
	return i
}
