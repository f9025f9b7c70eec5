package keyfuncs

import (
	"encoding/binary"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// PeerIP keys a request by its TCP peer, r.RemoteAddr ("ip:port",
// "[ipv6%zone]:port" or a bare address, IPv6 without brackets read whole):
// "ip:" and the address, IPv4 whole ("ip:192.0.2.1"), IPv6 by its /64
// ("ip:2001:db8:1:2::/64"), IPv4-mapped IPv6 read as IPv4 before grouping;
// at most 46 bytes. Behind a proxy, use [ClientIP].
func PeerIP(r *http.Request) (string, error) {
	return defaultIPKeyer.peer(r)
}

// AppendPeerIP appends the key [PeerIP] gives r to dst, or returns dst and
// PeerIP's error. It allocates only if dst must grow or r has no address.
func AppendPeerIP(dst []byte, r *http.Request) ([]byte, error) {
	return defaultIPKeyer.appendPeer(dst, r)
}

// PeerIPPrefix returns [PeerIP] with other prefix lengths, v4Bits 1 to 32 and
// v6Bits 1 to 128 (PeerIP's 32 and 64): a full-length prefix keys the bare
// address, any other is in CIDR notation ("ip:192.0.2.0/24").
func PeerIPPrefix(v4Bits, v6Bits int) (KeyFunc, error) {
	if v4Bits < 1 || v4Bits > 32 {
		return nil, invalid("PeerIPPrefix v4Bits %d is outside [1, 32]", v4Bits)
	}
	if v6Bits < 1 || v6Bits > 128 {
		return nil, invalid("PeerIPPrefix v6Bits %d is outside [1, 128]", v6Bits)
	}
	return ipKeyer{v4Bits, v6Bits}.peer, nil
}

var defaultIPKeyer = ipKeyer{v4Bits: 32, v6Bits: 64}

// ipKeyer turns addresses into "ip:" keys at given prefix lengths.
type ipKeyer struct{ v4Bits, v6Bits int }

// maxIPKeyLen is the longest IP key: "ip:", 39 bytes of IPv6 and "/127".
const maxIPKeyLen = 3 + 39 + 4

func (k ipKeyer) peer(r *http.Request) (string, error) {
	var buf [maxIPKeyLen]byte
	b, err := k.appendPeer(buf[:0], r) // on error, b is empty
	return string(b), err
}

func (k ipKeyer) appendPeer(dst []byte, r *http.Request) ([]byte, error) {
	if k.v4Bits == 32 {
		// Copying net/http's "a.b.c.d:port" halves AppendPeerIP, the default key.
		if host, ok := canonicalIPv4Host(r.RemoteAddr); ok {
			return append(append(dst, "ip:"...), host...), nil
		}
	}
	addr, ok := parseAddr(r.RemoteAddr)
	if !ok {
		return dst, errNotAnAddr(r.RemoteAddr)
	}
	return k.appendKey(dst, addr), nil
}

// canonicalIPv4Host returns the host of s if s is "a.b.c.d:port" as netip writes it.
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

// key returns the key of addr (unmapped, so that the IPv4 prefix length
// applies to IPv4-mapped addresses) and records addr in r's address slot.
func (k ipKeyer) key(r *http.Request, addr netip.Addr) string {
	if slot, ok := r.Context().Value(addrSlotKey{}).(*netip.Addr); ok {
		*slot = addr
	}
	var buf [maxIPKeyLen]byte
	return string(k.appendKey(buf[:0], addr))
}

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

// appendPrefix6 appends IPv6 addr's prefix of 1 to 64 bits as netip.Prefix
// does, in a third of the time (the /64 is the default), its "::" at the end.
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
	return strconv.AppendInt(append(b, "::/"...), int64(bits), 10)
}

// appendHex16 appends v in hex: strconv.AppendUint takes over ten times as long.
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

// parseAddr reads an address in the forms of RemoteAddr (see PeerIP), with
// brackets only around IPv6 and ports of 1 to 5 digits; it drops the zone, unmaps.
func parseAddr(s string) (netip.Addr, bool) {
	host, bracketed := s, strings.HasPrefix(s, "[")
	if bracketed {
		h, rest, ok := strings.Cut(s[1:], "]")
		if !ok || rest != "" && (rest[0] != ':' || !validPort(rest[1:])) {
			return netip.Addr{}, false
		}
		host = h
	} else if h, port, ok := strings.Cut(s, ":"); ok && !strings.Contains(port, ":") {
		if !validPort(port) {
			return netip.Addr{}, false
		}
		host = h
	}
	// netip.ParseAddr would intern the zone, only for us to drop it.
	host, zone, zoned := strings.Cut(host, "%")
	addr, err := netip.ParseAddr(host)
	if err != nil || zoned && zone == "" || addr.Is4() && (zoned || bracketed) {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
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

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// errNotAnAddr is the server's fault (a Unix socket, say), not the client's.
func errNotAnAddr(remoteAddr string) error {
	return fmt.Errorf("keyfuncs: %w: %w: RemoteAddr %q is not an IP address", ErrInvalidConfig, ErrNoKey, clip(remoteAddr))
}
