package keyfuncs_test

import (
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/go-chi/httprate"

	"github.com/tollgate-go/tollgate/internal/race"
	"github.com/tollgate-go/tollgate/keyfuncs"
)

// request returns a request from remoteAddr.
func request(remoteAddr string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = remoteAddr
	return r
}

func TestPeerIP(t *testing.T) {
	tests := []struct {
		name, remoteAddr, want string
	}{
		{"IPv4 with port", "192.0.2.1:1234", "ip:192.0.2.1"},
		{"IPv4 without port", "192.0.2.1", "ip:192.0.2.1"},
		{"IPv4 port 0", "192.0.2.1:0", "ip:192.0.2.1"},
		{"IPv4 port 65535", "192.0.2.1:65535", "ip:192.0.2.1"},
		{"IPv6 brackets and port", "[2001:db8:1:2:3:4:5:6]:443", "ip:2001:db8:1:2::/64"},
		{"IPv6 bare", "2001:db8:1:2:3:4:5:6", "ip:2001:db8:1:2::/64"},
		{"IPv6 brackets without port", "[2001:db8:1:2::1]", "ip:2001:db8:1:2::/64"},
		{"IPv6 upper case", "[2001:DB8:1:2::ABCD]:80", "ip:2001:db8:1:2::/64"},
		{"IPv6 loopback", "[::1]:80", "ip:::/64"},
		{"IPv6 zone with port", "[fe80::1%eth0]:80", "ip:fe80::/64"},
		{"IPv6 zone bare", "fe80::1%eth0", "ip:fe80::/64"},
		{"IPv6 zone brackets without port", "[fe80::1%25]", "ip:fe80::/64"},
		{"IPv4-mapped with port", "[::ffff:1.2.3.4]:80", "ip:1.2.3.4"},
		{"IPv4-mapped bare", "::ffff:1.2.3.4", "ip:1.2.3.4"},
		{"IPv4-mapped hex", "[::ffff:102:304]:80", "ip:1.2.3.4"},
		{"IPv4-mapped with zone", "[::ffff:1.2.3.4%eth0]:80", "ip:1.2.3.4"},
		{"IPv4-compatible stays IPv6", "[::1.2.3.4]:80", "ip:::/64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := keyfuncs.PeerIP(request(tt.remoteAddr))
			if err != nil || got != tt.want {
				t.Errorf("PeerIP(%q) = %q, %v; want %q, nil", tt.remoteAddr, got, err, tt.want)
			}
		})
	}
}

func TestPeerIPGroupsIPv6By64(t *testing.T) {
	key := func(remoteAddr string) string {
		t.Helper()
		k, err := keyfuncs.PeerIP(request(remoteAddr))
		if err != nil {
			t.Fatalf("PeerIP(%q): %v", remoteAddr, err)
		}
		return k
	}
	a := key("[2001:db8:1:2::1]:1000")
	if b := key("[2001:db8:1:2:ffff:ffff:ffff:ffff]:2000"); b != a {
		t.Errorf("same /64: got %q and %q, want equal keys", a, b)
	}
	if c := key("[2001:db8:1:3::1]:1000"); c == a {
		t.Errorf("different /64s: got %q for both, want different keys", a)
	}
	if d, e := key("192.0.2.1:1"), key("192.0.2.2:1"); d == e {
		t.Errorf("different IPv4 addresses: got %q for both, want different keys", d)
	}
}

func TestPeerIPBadRemoteAddr(t *testing.T) {
	for _, remoteAddr := range []string{
		"",
		"garbage",
		"example.com:80",
		"@",
		":80",
		"192.0.2.1:",
		"192.0.2.1:http",
		"192.0.2.1:65536",
		"192.0.2.1:000080",
		"192.0.2.1:-1",
		"192.0.2.1:80:80",
		"192.0.2.1%eth0:80",
		"192.0.2.1%eth0",
		"256.0.2.1:80",
		"1.2.3:80",
		"01.2.3.4:80",
		"[192.0.2.1]:80",
		"[192.0.2.1]",
		"[2001:db8::1",
		"2001:db8::1]:80",
		"[2001:db8::1]80",
		"[2001:db8::1]:",
		"[2001:db8::1]:99999",
		"[2001:db8::1]:80]",
		"[]:80",
		"[]",
		"[fe80::1%]:80",
		"fe80::1%",
		"2001:db8::g",
		" 192.0.2.1:80",
		"192.0.2.1:80 ",
		strings.Repeat("garbage", 100),
	} {
		name := remoteAddr
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		t.Run(strconv.Quote(name), func(t *testing.T) {
			got, err := keyfuncs.PeerIP(request(remoteAddr))
			if !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
				t.Errorf("PeerIP(%q) = %q, %v; want \"\", an error wrapping ErrNoKey", remoteAddr, got, err)
			}
		})
	}
}

func TestPeerIPPrefix(t *testing.T) {
	tests := []struct {
		name           string
		v4Bits, v6Bits int
		remoteAddr     string
		want           string
	}{
		{"IPv4 /24", 24, 56, "192.0.2.77:1", "ip:192.0.2.0/24"},
		{"IPv6 /56", 24, 56, "[2001:db8:1:2ff::1]:1", "ip:2001:db8:1:200::/56"},
		{"IPv6 /48", 32, 48, "[2001:db8:1:2ff::1]:1", "ip:2001:db8:1::/48"},
		{"IPv4 /32 is the bare address", 32, 48, "192.0.2.77:1", "ip:192.0.2.77"},
		{"IPv6 /128 is the bare address", 32, 128, "[2001:db8::1]:1", "ip:2001:db8::1"},
		{"IPv4-mapped unmapped before masking", 24, 56, "[::ffff:192.0.2.77]:1", "ip:192.0.2.0/24"},
		{"IPv4 /1", 1, 1, "192.0.2.77:1", "ip:128.0.0.0/1"},
		{"IPv6 /1", 1, 1, "[2001:db8::1]:1", "ip:::/1"},
		{"zone dropped", 32, 128, "[fe80::1%eth0]:1", "ip:fe80::1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kf, err := keyfuncs.PeerIPPrefix(tt.v4Bits, tt.v6Bits)
			if err != nil {
				t.Fatalf("PeerIPPrefix(%d, %d): %v", tt.v4Bits, tt.v6Bits, err)
			}
			got, err := kf(request(tt.remoteAddr))
			if err != nil || got != tt.want {
				t.Errorf("PeerIPPrefix(%d, %d)(%q) = %q, %v; want %q, nil", tt.v4Bits, tt.v6Bits, tt.remoteAddr, got, err, tt.want)
			}
		})
	}

	t.Run("32 and 64 is PeerIP", func(t *testing.T) {
		kf, err := keyfuncs.PeerIPPrefix(32, 64)
		if err != nil {
			t.Fatal(err)
		}
		for _, remoteAddr := range []string{"192.0.2.1:1", "[2001:db8:1:2::1]:1", "garbage"} {
			got, gotErr := kf(request(remoteAddr))
			want, wantErr := keyfuncs.PeerIP(request(remoteAddr))
			if got != want || (gotErr == nil) != (wantErr == nil) {
				t.Errorf("PeerIPPrefix(32, 64)(%q) = %q, %v; want %q, %v", remoteAddr, got, gotErr, want, wantErr)
			}
		}
	})
}

func TestPeerIPPrefixInvalid(t *testing.T) {
	tests := []struct {
		v4Bits, v6Bits int
		field          string
	}{
		{0, 64, "v4Bits"},
		{-1, 64, "v4Bits"},
		{33, 64, "v4Bits"},
		{32, 0, "v6Bits"},
		{32, -8, "v6Bits"},
		{32, 129, "v6Bits"},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.v4Bits)+","+strconv.Itoa(tt.v6Bits), func(t *testing.T) {
			kf, err := keyfuncs.PeerIPPrefix(tt.v4Bits, tt.v6Bits)
			if !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
				t.Fatalf("PeerIPPrefix(%d, %d) = %p, %v; want nil, an error wrapping ErrInvalidConfig", tt.v4Bits, tt.v6Bits, kf, err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name %s", err, tt.field)
			}
		})
	}
}

// FuzzPeerIP checks that PeerIP never panics, that it answers either an
// error wrapping ErrNoKey or an "ip:" key that parses back as a canonical,
// unmapped address or masked prefix, and that it agrees with a reference
// built from net.SplitHostPort and netip.ParseAddr wherever that accepts.
func FuzzPeerIP(f *testing.F) {
	for _, s := range []string{
		"192.0.2.1:1234", "192.0.2.1", "[2001:db8:1:2:3:4:5:6]:443", "2001:db8::1",
		"[fe80::1%eth0]:80", "fe80::1%eth0", "[::ffff:1.2.3.4]:80", "::ffff:1.2.3.4",
		"[::1]", "", "garbage", "[192.0.2.1]:80", "192.0.2.1:65536", "[fe80::1%]:80",
		// Near misses of the canonical IPv4 form that AppendPeerIP copies.
		"010.1.1.1:80", "1.2.3.4:80:90", "255.255.255.255:0", "256.1.1.1:1", "1.2.3.4:",
		"1.2.3.4:099999", "1234.1.1.1:1", "0.0.0.0:1", "1.2.3:4", "1.2.3.4.5:6", "1.2.3.04:5",
		"1.2.3.4%eth0:80", "1.2.3.4 :80", "::% ", "[fe80::1%Ethernet 2]:80", // a Windows adapter's name
	} {
		f.Add(s)
	}
	kf24, err := keyfuncs.PeerIPPrefix(24, 56)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, remoteAddr string) {
		r := &http.Request{RemoteAddr: remoteAddr} // all PeerIP reads; cheap
		for _, c := range []struct {
			kf             keyfuncs.KeyFunc
			v4Bits, v6Bits int
		}{{keyfuncs.PeerIP, 32, 64}, {kf24, 24, 56}} {
			key, err := c.kf(r)
			if err != nil {
				if !errors.Is(err, keyfuncs.ErrNoKey) || key != "" {
					t.Fatalf("PeerIP(%q) = %q, %v; want an error wrapping ErrNoKey", remoteAddr, key, err)
				}
			} else {
				checkIPKey(t, remoteAddr, key, c.v4Bits, c.v6Bits)
			}
			if addr, ok := referenceAddr(remoteAddr); ok {
				want := referenceKey(addr, c.v4Bits, c.v6Bits)
				if err != nil || key != want {
					t.Fatalf("PeerIP(%q) /%d /%d = %q, %v; want %q (reference)", remoteAddr, c.v4Bits, c.v6Bits, key, err, want)
				}
			}
		}
		// AppendPeerIP appends exactly PeerIP's key, or fails as it does.
		key, err := keyfuncs.PeerIP(r)
		b, appendErr := keyfuncs.AppendPeerIP([]byte("{name:"), r)
		if string(b) != "{name:"+key || (err == nil) != (appendErr == nil) {
			t.Fatalf("AppendPeerIP(%q) = %q, %v; want %q, %v", remoteAddr, b, appendErr, "{name:"+key, err)
		}
	})
}

// checkIPKey fails t unless key is a well-formed "ip:" key.
func checkIPKey(t *testing.T, remoteAddr, key string, v4Bits, v6Bits int) {
	t.Helper()
	rest, ok := strings.CutPrefix(key, "ip:")
	if !ok {
		t.Fatalf("PeerIP(%q) = %q; want a key starting with \"ip:\"", remoteAddr, key)
	}
	if len(key) > 46 {
		t.Fatalf("PeerIP(%q) = %q; want at most 46 bytes", remoteAddr, key)
	}
	var addr netip.Addr
	if strings.Contains(rest, "/") {
		p, err := netip.ParsePrefix(rest)
		if err != nil {
			t.Fatalf("PeerIP(%q) = %q: %v", remoteAddr, key, err)
		}
		if p != p.Masked() {
			t.Fatalf("PeerIP(%q) = %q; want a masked prefix", remoteAddr, key)
		}
		if want := map[bool]int{true: v4Bits, false: v6Bits}[p.Addr().Is4()]; p.Bits() != want {
			t.Fatalf("PeerIP(%q) = %q; want a /%d prefix", remoteAddr, key, want)
		}
		addr = p.Addr()
	} else {
		a, err := netip.ParseAddr(rest)
		if err != nil {
			t.Fatalf("PeerIP(%q) = %q: %v", remoteAddr, key, err)
		}
		if want := map[bool]int{true: v4Bits, false: v6Bits}[a.Is4()]; a.BitLen() != want {
			t.Fatalf("PeerIP(%q) = %q; want a /%d prefix", remoteAddr, key, want)
		}
		addr = a
	}
	if addr.Zone() != "" || addr.Is4In6() {
		t.Fatalf("PeerIP(%q) = %q; want no zone and no IPv4-mapped address", remoteAddr, key)
	}
	if addr.String() != strings.SplitN(rest, "/", 2)[0] {
		t.Fatalf("PeerIP(%q) = %q; want the canonical form %s", remoteAddr, key, addr)
	}
}

// referenceAddr parses remoteAddr the slow, obvious way, accepting a subset
// of what PeerIP must accept: "host:port" as net.SplitHostPort splits it
// (brackets only around IPv6, a decimal port of at most 5 digits), or a
// bare address that netip.ParseAddr accepts whole.
func referenceAddr(remoteAddr string) (netip.Addr, bool) {
	if host, port, err := net.SplitHostPort(remoteAddr); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil || len(port) > 5 {
			return netip.Addr{}, false
		}
		addr, err := netip.ParseAddr(host)
		if err != nil || addr.Is4() == strings.HasPrefix(remoteAddr, "[") {
			return netip.Addr{}, false
		}
		return addr.WithZone("").Unmap(), true
	}
	addr, err := netip.ParseAddr(remoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.WithZone("").Unmap(), true
}

func referenceKey(addr netip.Addr, v4Bits, v6Bits int) string {
	bits := v6Bits
	if addr.Is4() {
		bits = v4Bits
	}
	if bits == addr.BitLen() {
		return "ip:" + addr.String()
	}
	return "ip:" + netip.PrefixFrom(addr, bits).Masked().String()
}

func TestAppendPeerIP(t *testing.T) {
	for _, tc := range []struct{ remoteAddr, want string }{
		{"192.0.2.1:1234", "xip:192.0.2.1"},
		{"10.0.0.255:1", "xip:10.0.0.255"},
		{"[2001:db8:1:2:3:4:5:6]:443", "xip:2001:db8:1:2::/64"},
		{"[::ffff:1.2.3.4]:80", "xip:1.2.3.4"},
		{"192.0.2.1", "xip:192.0.2.1"},
	} {
		got, err := keyfuncs.AppendPeerIP([]byte("x"), request(tc.remoteAddr))
		if err != nil || string(got) != tc.want {
			t.Errorf("AppendPeerIP(%q, %q) = %q, %v; want %q", "x", tc.remoteAddr, got, err, tc.want)
		}
	}
	for _, remoteAddr := range []string{"garbage", "010.0.0.1:80", "1.2.3.4:65536"} {
		got, err := keyfuncs.AppendPeerIP([]byte("x"), request(remoteAddr))
		if !errors.Is(err, keyfuncs.ErrNoKey) || string(got) != "x" {
			t.Errorf("AppendPeerIP(%q, %q) = %q, %v; want %q and an error wrapping ErrNoKey", "x", remoteAddr, got, err, "x")
		}
	}
	if testing.Short() || race.Enabled {
		return
	}
	for _, remoteAddr := range []string{"192.0.2.1:1234", "[2001:db8:1:2:3:4:5:6]:443"} {
		r := request(remoteAddr)
		buf := make([]byte, 0, 64)
		if n := testing.AllocsPerRun(100, func() { keyfuncs.AppendPeerIP(buf, r) }); n != 0 {
			t.Errorf("AppendPeerIP(%q): %v allocations, want 0", remoteAddr, n)
		}
	}
}

func BenchmarkPeerIP(b *testing.B) {
	for _, bc := range []struct {
		name string
		kf   keyfuncs.KeyFunc
		addr string
	}{
		{"IPv4", keyfuncs.PeerIP, "192.0.2.1:54321"},
		{"IPv6", keyfuncs.PeerIP, "[2001:db8:85a3:1234:8a2e:370:7334:1]:54321"},
		{"IPv6-zone", keyfuncs.PeerIP, "[fe80::1ff:fe23:4567:890a%eth0]:54321"},
		{"IPv4-mapped", keyfuncs.PeerIP, "[::ffff:192.0.2.1]:54321"},
		{"bad", keyfuncs.PeerIP, "garbage"},
		// Reference: httprate's KeyByIP (no /64 grouping, no validation).
		{"httprate.KeyByIP/IPv4", httprate.KeyByIP, "192.0.2.1:54321"},
		{"httprate.KeyByIP/IPv6", httprate.KeyByIP, "[2001:db8:85a3:1234:8a2e:370:7334:1]:54321"},
	} {
		r := request(bc.addr)
		b.Run(bc.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				bc.kf(r)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.kf(r)
				}
			})
		})
	}
}

// TestPeerIPPrefixFormsIPv6 checks the keys of IPv6 prefixes of every
// length up to 64, which the package formats itself, against netip's
// canonical form, on addresses dense with zero groups (where "::" goes).
func TestPeerIPPrefixFormsIPv6(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	groups := []uint16{0, 0, 0, 1, 0xf, 0x10, 0xff, 0x100, 0xfff, 0x1000, 0xffff, 0xdb8, 0x2001}
	kfs := make([]keyfuncs.KeyFunc, 65)
	for bits := 1; bits <= 64; bits++ {
		var err error
		if kfs[bits], err = keyfuncs.PeerIPPrefix(32, bits); err != nil {
			t.Fatal(err)
		}
	}
	for range 500 {
		var a [16]byte
		for g := range 8 {
			v := groups[rng.IntN(len(groups))]
			a[2*g], a[2*g+1] = byte(v>>8), byte(v)
		}
		addr := netip.AddrFrom16(a)
		if addr.Is4In6() {
			continue // read as IPv4
		}
		r := request("[" + addr.String() + "]:1")
		for bits := 1; bits <= 64; bits++ {
			got, err := kfs[bits](r)
			if want := "ip:" + netip.PrefixFrom(addr, bits).Masked().String(); err != nil || got != want {
				t.Fatalf("/%d of %s: got %q, %v; want %q", bits, addr, got, err, want)
			}
		}
	}
}
