package keyfuncs

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Default prefix lengths of IP keys: an IPv4 address is one subject; an IPv6
// client usually holds a whole /64, so it is one subject too.
const (
	defaultV4Bits = 32
	defaultV6Bits = 64
)

// PeerIP keys a request by its TCP peer, r.RemoteAddr: "ip:" and the
// address, IPv4 whole ("ip:192.0.2.1") and IPv6 grouped by its /64
// ("ip:2001:db8:1:2::/64"). The port and any IPv6 zone are dropped, and an
// IPv4-mapped IPv6 address (::ffff:a.b.c.d, from dual-stack listeners) is
// read as the IPv4 address before any grouping. Keys are at most 46 bytes.
//
// RemoteAddr may be "ip:port", "[ipv6]:port", "[ipv6%zone]:port", or a bare
// address ("192.0.2.1", "2001:db8::1", "[2001:db8::1]"); an IPv6 address
// without brackets is read whole, never as address and port. A RemoteAddr
// that does not parse is an error wrapping [ErrNoKey], never a shared key.
//
// PeerIP trusts only the TCP peer: behind a proxy or load balancer every
// client has the proxy's address. There, use [ClientIP] with the proxies'
// networks; see the package's trust model.
func PeerIP(r *http.Request) (string, error) {
	return defaultIPKeyer.peer(r)
}

// AppendPeerIP appends the key [PeerIP] gives r to dst and returns the
// extended slice, or dst and PeerIP's error. It allocates nothing unless
// dst must grow or r has no usable address, so a caller that builds a
// longer key around the subject (as the middleware builds its store key)
// need not allocate the subject first.
func AppendPeerIP(dst []byte, r *http.Request) ([]byte, error) {
	return defaultIPKeyer.appendPeer(dst, r)
}

// PeerIPPrefix returns [PeerIP] with other prefix lengths: v4Bits for IPv4
// (1 to 32; PeerIP uses 32) and v6Bits for IPv6 (1 to 128; PeerIP uses 64),
// such as 24 and 56. A key for a full-length prefix is the bare address
// ("ip:192.0.2.1"); any other is in CIDR notation ("ip:192.0.2.0/24",
// "ip:2001:db8:1::/48"). A length out of range is an error wrapping
// [ErrInvalidConfig]; 0, which would put every client in one bucket, is out
// of range (use [Static] for a global limit).
func PeerIPPrefix(v4Bits, v6Bits int) (KeyFunc, error) {
	if v4Bits < 1 || v4Bits > 32 {
		return nil, invalid("PeerIPPrefix v4Bits %d is outside [1, 32]", v4Bits)
	}
	if v6Bits < 1 || v6Bits > 128 {
		return nil, invalid("PeerIPPrefix v6Bits %d is outside [1, 128]", v6Bits)
	}
	return ipKeyer{v4Bits: v4Bits, v6Bits: v6Bits}.peer, nil
}

var defaultIPKeyer = ipKeyer{v4Bits: defaultV4Bits, v6Bits: defaultV6Bits}

// ipKeyer turns addresses into "ip:" keys at given prefix lengths. The
// trusted-proxy client IP resolver shares it: it only differs in where the
// address comes from.
type ipKeyer struct {
	v4Bits, v6Bits int // validated: 1..32, 1..128
}

func (k ipKeyer) peer(r *http.Request) (string, error) {
	// Built in a stack buffer: the only allocation is the returned string.
	var buf [maxIPKeyLen]byte
	b, err := k.appendPeer(buf[:0], r)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// appendPeer appends the key of r's peer to dst.
func (k ipKeyer) appendPeer(dst []byte, r *http.Request) ([]byte, error) {
	if k.v4Bits == 32 {
		// The common case, an IPv4 peer as net/http writes it: its text is
		// already the key's, so it is copied rather than parsed and
		// formatted again (PeerIP takes about half the time).
		if host, ok := canonicalIPv4Host(r.RemoteAddr); ok {
			return append(append(dst, "ip:"...), host...), nil
		}
	}
	addr, err := parseRemoteAddr(r.RemoteAddr)
	if err != nil {
		return dst, err
	}
	return k.appendKey(dst, addr), nil
}

// canonicalIPv4Host returns the address of s when s is "a.b.c.d:port" with
// the address in canonical dotted-decimal form (each field a number from 0
// to 255 without leading zeros) and a valid port: the form in which net/http
// gives every IPv4 peer. Such an address is exactly what
// netip.Addr.String would write for it. Any other s, valid or not, is left
// to parseRemoteAddr.
func canonicalIPv4Host(s string) (string, bool) {
	i := 0
	for field := 0; field < 4; field++ {
		if field > 0 {
			if i >= len(s) || s[i] != '.' {
				return "", false
			}
			i++
		}
		start, v := i, 0
		for i < len(s) && i-start < 3 && s[i] >= '0' && s[i] <= '9' {
			v = v*10 + int(s[i]-'0')
			i++
		}
		if n := i - start; n == 0 || v > 255 || n > 1 && s[start] == '0' {
			return "", false
		}
	}
	if i >= len(s) || s[i] != ':' || !validPort(s[i+1:]) {
		return "", false
	}
	return s[:i], true
}

// maxIPKeyLen is the longest IP key: "ip:", 39 bytes of IPv6 and "/127".
const maxIPKeyLen = 3 + 39 + 4

// key returns the key of addr, a valid address without zone, already
// unmapped from IPv4-mapped IPv6 (so that the IPv4 prefix length applies).
func (k ipKeyer) key(addr netip.Addr) string {
	// Built in a stack buffer: the only allocation is the returned string.
	var buf [maxIPKeyLen]byte
	return string(k.appendKey(buf[:0], addr))
}

// appendKey appends the key of addr (as for key) to b.
func (k ipKeyer) appendKey(b []byte, addr netip.Addr) []byte {
	bits := k.v6Bits
	if addr.Is4() {
		bits = k.v4Bits
	}
	b = append(b, "ip:"...)
	switch {
	case bits == addr.BitLen():
		return addr.AppendTo(b)
	case bits <= 64 && addr.Is6():
		return appendPrefix6(b, addr, bits)
	}
	p, _ := addr.Prefix(bits) // cannot fail: addr is valid, bits in range
	return p.AppendTo(b)
}

// appendPrefix6 appends the prefix of IPv6 addr of length bits (1 to 64)
// in the form of netip.Prefix.AppendTo, in a quarter of the time (the /64
// key is the default). The low 64 bits of the masked address are zero,
// so the longest run of zero groups, which RFC 5952 writes "::", is the one
// that ends the address: no run of the first four groups is as long.
func appendPrefix6(b []byte, addr netip.Addr, bits int) []byte {
	a := addr.As16()
	hi := binary.BigEndian.Uint64(a[:8]) &^ (1<<(64-bits) - 1)
	n := 4 // groups before the final run of zeros
	for n > 0 && uint16(hi>>(64-16*n)) == 0 {
		n--
	}
	for g := 0; g < n; g++ {
		if g > 0 {
			b = append(b, ':')
		}
		b = appendHex16(b, uint16(hi>>(48-16*g)))
	}
	b = append(b, "::/"...)
	if bits >= 10 {
		b = append(b, byte('0'+bits/10))
	}
	return append(b, byte('0'+bits%10))
}

// appendHex16 appends v in lower-case hexadecimal without leading zeros.
func appendHex16(b []byte, v uint16) []byte {
	const digits = "0123456789abcdef"
	switch {
	case v >= 0x1000:
		b = append(b, digits[v>>12])
		fallthrough
	case v >= 0x100:
		b = append(b, digits[v>>8&0xf])
		fallthrough
	case v >= 0x10:
		b = append(b, digits[v>>4&0xf])
	}
	return append(b, digits[v&0xf])
}

// parseRemoteAddr returns the address of a RemoteAddr ("ip:port",
// "[ipv6]:port", "[ipv6%zone]:port" or a bare address, see PeerIP) with the
// zone dropped and IPv4-mapped IPv6 unmapped. Brackets hold only IPv6;
// a port is 1 to 5 digits, at most 65535. It does not allocate unless it
// fails.
func parseRemoteAddr(s string) (netip.Addr, error) {
	addr, ok := parseAddr(s)
	if !ok {
		return netip.Addr{}, badRemoteAddr(s)
	}
	return addr, nil
}

// parseAddr is parseRemoteAddr without the error: the client IP resolver
// reads forwarded addresses with it, in the same forms, and falls back
// without building an error it would drop. It does not allocate unless it
// fails.
func parseAddr(s string) (netip.Addr, bool) {
	host, bracketed, ok := splitHostPort(s)
	if !ok {
		return netip.Addr{}, false
	}
	// The zone is cut here rather than by netip.ParseAddr, which would
	// intern it only for us to drop it.
	zoned := false
	if i := strings.IndexByte(host, '%'); i >= 0 {
		if i == len(host)-1 {
			return netip.Addr{}, false // empty zone
		}
		host, zoned = host[:i], true
	}
	addr, err := netip.ParseAddr(host)
	if err != nil || (addr.Is4() && (zoned || bracketed)) {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// splitHostPort returns the address part of s: the text in brackets, or
// before the one colon of "ipv4:port", or s itself when it is bare (no
// colon, or two or more colons without brackets).
func splitHostPort(s string) (host string, bracketed, ok bool) {
	if s == "" {
		return "", false, false
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", false, false
		}
		if rest := s[end+1:]; rest != "" && (rest[0] != ':' || !validPort(rest[1:])) {
			return "", false, false
		}
		return s[1:end], true, true
	}
	i := strings.IndexByte(s, ':')
	if i < 0 || strings.IndexByte(s[i+1:], ':') >= 0 {
		return s, false, true
	}
	if !validPort(s[i+1:]) {
		return "", false, false
	}
	return s[:i], false, true
}

func validPort(p string) bool {
	if len(p) == 0 || len(p) > 5 {
		return false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
		n = n*10 + int(p[i]-'0')
	}
	return n <= 65535
}

func badRemoteAddr(s string) error {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Errorf("keyfuncs: %w: RemoteAddr %q is not an IP address", ErrNoKey, s)
}
