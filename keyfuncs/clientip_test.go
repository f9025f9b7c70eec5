package keyfuncs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/tollgate-go/tollgate/keyfuncs"
)

// The networks of the tests' proxies: a private IPv4 range, an IPv6 /48,
// one bare address, and an IPv4-mapped network (read as 172.16.0.0/12).
var trustedNets = []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.1", "::ffff:172.16.0.0/108"}

// Peers of the tests: a trusted proxy, a trusted IPv6 proxy, and an
// untrusted client connecting directly.
const (
	proxy     = "10.0.0.1:443"
	proxyV6   = "[2001:db8:ffff::1]:443"
	untrusted = "203.0.113.7:5555"
)

// ipConfigs are the option lists of the tests, by name.
var ipConfigs = map[string][]keyfuncs.IPOption{
	"peer":    nil,
	"peer/56": {keyfuncs.IPv6Prefix(56)},
	"xff":     {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromXForwardedFor()},
	"xff/56":  {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromXForwardedFor(), keyfuncs.IPv6Prefix(56)},
	"xff/48":  {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromXForwardedFor(), keyfuncs.IPv6Prefix(48)},
	"xff/128": {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromXForwardedFor(), keyfuncs.IPv6Prefix(128)},
	"xff/24":  {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromXForwardedFor(), keyfuncs.IPv4Prefix(24)},
	"xff max3": {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromXForwardedFor(),
		keyfuncs.MaxForwarded(3)},
	"fwd":   {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromForwarded()},
	"real":  {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromHeader("X-Real-IP")},
	"cf":    {keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromHeader("cf-connecting-ip")},
	"hops1": {keyfuncs.TrustProxies(trustedNets...), keyfuncs.TrustedHops(1)},
	"hops2": {keyfuncs.TrustProxies(trustedNets...), keyfuncs.TrustedHops(2)},
	"hops3": {keyfuncs.TrustProxies("0.0.0.0/0", "::/0"), keyfuncs.TrustedHops(3)},
}

// headerRequest returns a request from remoteAddr with the header field
// lines given as "Name: value"; the value is everything after ": ", spaces
// included.
func headerRequest(remoteAddr string, lines ...string) *http.Request {
	r := request(remoteAddr)
	for _, l := range lines {
		name, value, ok := strings.Cut(l, ": ")
		if !ok {
			panic("header line without \": \": " + l)
		}
		r.Header.Add(name, value)
	}
	return r
}

func mustClientIP(t testing.TB, opts ...keyfuncs.IPOption) keyfuncs.KeyFunc {
	t.Helper()
	kf, err := keyfuncs.ClientIP(opts...)
	if err != nil {
		t.Fatalf("ClientIP: %v", err)
	}
	return kf
}

func TestClientIP(t *testing.T) {
	const client = "ip:198.51.100.1"
	const client6 = "ip:2001:db8:1:2::/64"
	long := strings.Repeat("1.1.1.1, ", 2000) // 18 000 bytes of forged addresses
	tests := []struct {
		name, config, remoteAddr string
		header                   []string
		want                     string
	}{
		// Plain peers: no source, headers never read.
		{"peer IPv4 with port", "peer", "198.51.100.1:1234", nil, client},
		{"peer IPv4 bare", "peer", "198.51.100.1", nil, client},
		{"peer IPv6 with port", "peer", "[2001:db8:1:2::99]:443", nil, client6},
		{"peer IPv6 bare", "peer", "2001:db8:1:2::99", nil, client6},
		{"peer IPv6 zone", "peer", "[fe80::1%eth0]:80", nil, "ip:fe80::/64"},
		{"peer IPv4-mapped", "peer", "[::ffff:198.51.100.1]:80", nil, client},
		{"peer IPv4-mapped hex", "peer", "[::ffff:c633:6401]:80", nil, client},
		{"peer IPv4-mapped with zone", "peer", "[::ffff:198.51.100.1%eth0]:80", nil, client},
		{"peer IPv6 /56", "peer/56", "[2001:db8:1:2ff::1]:1", nil, "ip:2001:db8:1:200::/56"},
		{"peer IPv4-mapped with /56", "peer/56", "[::ffff:198.51.100.1]:80", nil, client},
		{"peer headers ignored without a source", "peer", proxy,
			[]string{"X-Forwarded-For: 198.51.100.1", "X-Real-IP: 198.51.100.1"}, "ip:10.0.0.1"},

		// Untrusted peers: headers never read.
		{"untrusted XFF", "xff", untrusted, []string{"X-Forwarded-For: 198.51.100.1"}, "ip:203.0.113.7"},
		{"untrusted Forwarded", "fwd", untrusted, []string{"Forwarded: for=198.51.100.1"}, "ip:203.0.113.7"},
		{"untrusted X-Real-IP", "real", untrusted, []string{"X-Real-IP: 198.51.100.1"}, "ip:203.0.113.7"},
		{"untrusted hops", "hops1", untrusted, []string{"X-Forwarded-For: 198.51.100.1"}, "ip:203.0.113.7"},
		{"untrusted IPv6 XFF", "xff", "[2001:db8:9::1]:1", []string{"X-Forwarded-For: 198.51.100.1"}, "ip:2001:db8:9::/64"},
		{"untrusted next to the bare trusted address", "xff", "192.0.2.2:1",
			[]string{"X-Forwarded-For: 198.51.100.1"}, "ip:192.0.2.2"},

		// X-Forwarded-For through trusted proxies.
		{"XFF one address", "xff", proxy, []string{"X-Forwarded-For: 198.51.100.1"}, client},
		{"XFF address with port", "xff", proxy, []string{"X-Forwarded-For: 198.51.100.1:5678"}, client},
		{"XFF IPv6", "xff", proxy, []string{"X-Forwarded-For: 2001:db8:1:2::99"}, client6},
		{"XFF IPv6 brackets and port", "xff", proxy, []string{"X-Forwarded-For: [2001:db8:1:2::99]:443"}, client6},
		{"XFF IPv6 zone", "xff", proxy, []string{"X-Forwarded-For: fe80::1%eth0"}, "ip:fe80::/64"},
		{"XFF IPv4-mapped", "xff", proxy, []string{"X-Forwarded-For: ::ffff:198.51.100.1"}, client},
		{"XFF through trusted IPv6 peer", "xff", proxyV6, []string{"X-Forwarded-For: 198.51.100.1"}, client},
		{"XFF peer in IPv4-mapped network", "xff", "172.16.0.5:1", []string{"X-Forwarded-For: 198.51.100.1"}, client},
		{"XFF mapped peer in IPv4-mapped network", "xff", "[::ffff:172.16.0.5]:1",
			[]string{"X-Forwarded-For: 198.51.100.1"}, client},
		{"XFF mapped peer in IPv4 network", "xff", "[::ffff:10.0.0.1]:1", []string{"X-Forwarded-For: 198.51.100.1"}, client},
		{"XFF trusted hops skipped", "xff", proxy,
			[]string{"X-Forwarded-For: 198.51.100.1, 10.0.0.3, 2001:db8:ffff::2, 192.0.2.1"}, client},
		{"XFF mapped trusted hop skipped", "xff", proxy, []string{"X-Forwarded-For: 198.51.100.1, ::ffff:10.0.0.9"}, client},
		{"XFF forged leftmost ignored", "xff", proxy, []string{"X-Forwarded-For: 1.1.1.1, 198.51.100.1, 10.0.0.2"}, client},
		{"XFF first untrusted from the right", "xff", proxy, []string{"X-Forwarded-For: 198.51.100.1, 192.0.2.2"}, "ip:192.0.2.2"},
		{"XFF several field lines", "xff", proxy,
			[]string{"X-Forwarded-For: 1.1.1.1", "X-Forwarded-For: 198.51.100.1, 10.0.0.2"}, client},
		{"XFF field line per hop", "xff", proxy,
			[]string{"X-Forwarded-For: 198.51.100.1", "X-Forwarded-For: 10.0.0.2"}, client},
		{"XFF empty last field line", "xff", proxy,
			[]string{"X-Forwarded-For: 1.1.1.1, 198.51.100.1", "X-Forwarded-For: "}, client},
		{"XFF whitespace", "xff", proxy, []string{"X-Forwarded-For: \t 198.51.100.1 \t,\t10.0.0.2  "}, client},
		{"XFF empty elements", "xff", proxy, []string{"X-Forwarded-For: ,198.51.100.1,, ,10.0.0.2,"}, client},
		{"XFF only empty elements", "xff", proxy, []string{"X-Forwarded-For: , ,,"}, "ip:10.0.0.1"},
		{"XFF missing", "xff", proxy, nil, "ip:10.0.0.1"},
		{"XFF every address trusted", "xff", proxy, []string{"X-Forwarded-For: 10.0.0.5, 10.0.0.4"}, "ip:10.0.0.5"},
		{"XFF every address trusted IPv6", "xff", proxyV6,
			[]string{"X-Forwarded-For: 2001:db8:ffff::9, 10.0.0.4"}, "ip:2001:db8:ffff::/64"},
		{"XFF garbage in the chain", "xff", proxy, []string{"X-Forwarded-For: 198.51.100.1, garbage, 10.0.0.2"}, "ip:10.0.0.1"},
		{"XFF garbage rightmost", "xff", proxy, []string{"X-Forwarded-For: 198.51.100.1, garbage"}, "ip:10.0.0.1"},
		{"XFF unknown", "xff", proxy, []string{"X-Forwarded-For: unknown"}, "ip:10.0.0.1"},
		{"XFF garbage left of the client", "xff", proxy, []string{"X-Forwarded-For: garbage, 198.51.100.1"}, client},
		{"XFF leading zeros refused", "xff", proxy, []string{"X-Forwarded-For: 010.1.1.1"}, "ip:10.0.0.1"},
		{"XFF leading zeros in mapped refused", "xff", proxy, []string{"X-Forwarded-For: ::ffff:010.1.1.1"}, "ip:10.0.0.1"},
		{"XFF short IPv4 refused", "xff", proxy, []string{"X-Forwarded-For: 1.2.3"}, "ip:10.0.0.1"},
		{"XFF hex IPv4 refused", "xff", proxy, []string{"X-Forwarded-For: 0xc6.51.100.1"}, "ip:10.0.0.1"},
		{"XFF IPv4 in brackets refused", "xff", proxy, []string{"X-Forwarded-For: [198.51.100.1]"}, "ip:10.0.0.1"},
		{"XFF host name refused", "xff", proxy, []string{"X-Forwarded-For: example.com"}, "ip:10.0.0.1"},
		{"XFF space-separated refused", "xff", proxy, []string{"X-Forwarded-For: 198.51.100.1 10.0.0.2"}, "ip:10.0.0.1"},
		{"XFF over-long forged left part", "xff", proxy, []string{"X-Forwarded-For: " + long + "198.51.100.1"}, client},
		{"XFF over-long trusted chain", "xff", proxy,
			[]string{"X-Forwarded-For: 198.51.100.1, " + strings.Repeat("10.0.0.3, ", 1000) + "10.0.0.2"}, "ip:10.0.0.1"},
		{"XFF over-long whitespace", "xff", proxy,
			[]string{"X-Forwarded-For: 198.51.100.1," + strings.Repeat(" ", 9000) + ",10.0.0.2"}, "ip:10.0.0.1"},
		{"XFF over-long single element", "xff", proxy, []string{"X-Forwarded-For: " + strings.Repeat("9", 9000)}, "ip:10.0.0.1"},
		{"XFF over-long field lines", "xff", proxy, []string{
			"X-Forwarded-For: 198.51.100.1",
			"X-Forwarded-For: " + strings.Repeat(" ", 8184) + "10.0.0.2", // 8192 bytes: nothing left for the first line
		}, "ip:10.0.0.1"},
		{"XFF address cut at the 8 KiB edge", "xff", proxy, []string{
			// 8193 bytes: the window cuts "198.51.100.11" to "98.51.100.11".
			"X-Forwarded-For: 198.51.100.11," + strings.Repeat(" ", 8193-len("198.51.100.11,10.0.0.2")) + "10.0.0.2",
		}, "ip:10.0.0.1"},
		{"XFF within the cap", "xff max3", proxy, []string{"X-Forwarded-For: 198.51.100.1, 10.0.0.3, 10.0.0.2"}, client},
		{"XFF beyond the cap", "xff max3", proxy,
			[]string{"X-Forwarded-For: 198.51.100.1, 10.0.0.4, 10.0.0.3, 10.0.0.2"}, "ip:10.0.0.1"},
		{"XFF all trusted at the cap", "xff max3", proxy, []string{"X-Forwarded-For: 10.0.0.4, 10.0.0.3, 10.0.0.2"}, "ip:10.0.0.4"},
		{"XFF empty elements not counted", "xff max3", proxy, []string{"X-Forwarded-For: 198.51.100.1,,, 10.0.0.3,,,, 10.0.0.2"}, client},
		{"XFF X-Real-IP ignored", "xff", proxy, []string{"X-Real-IP: 1.1.1.1", "X-Forwarded-For: 198.51.100.1"}, client},

		// Grouping.
		{"XFF IPv6 /56", "xff/56", proxy, []string{"X-Forwarded-For: 2001:db8:1:2ff::1"}, "ip:2001:db8:1:200::/56"},
		{"XFF IPv6 /48", "xff/48", proxy, []string{"X-Forwarded-For: 2001:db8:1:2ff::1"}, "ip:2001:db8:1::/48"},
		{"XFF IPv6 /128", "xff/128", proxy, []string{"X-Forwarded-For: 2001:db8:1:2::99"}, "ip:2001:db8:1:2::99"},
		{"XFF IPv4 /24", "xff/24", proxy, []string{"X-Forwarded-For: 198.51.100.77"}, "ip:198.51.100.0/24"},
		{"XFF IPv4-mapped with /64", "xff", proxy, []string{"X-Forwarded-For: ::ffff:198.51.100.77"}, "ip:198.51.100.77"},
		{"XFF IPv4-mapped with /24", "xff/24", proxy, []string{"X-Forwarded-For: ::ffff:198.51.100.77"}, "ip:198.51.100.0/24"},
		{"XFF IPv4-mapped with /48", "xff/48", proxy, []string{"X-Forwarded-For: [::ffff:198.51.100.77]:80"}, "ip:198.51.100.77"},

		// Forwarded through trusted proxies.
		{"Forwarded token", "fwd", proxy, []string{"Forwarded: for=198.51.100.1"}, client},
		{"Forwarded quoted with port", "fwd", proxy, []string{`Forwarded: for="198.51.100.1:4711"`}, client},
		{"Forwarded IPv6 brackets and port", "fwd", proxy, []string{`Forwarded: for="[2001:db8:1:2::99]:4711"`}, client6},
		{"Forwarded IPv6 brackets", "fwd", proxy, []string{`Forwarded: for="[2001:db8:1:2::99]"`}, client6},
		{"Forwarded IPv6 unquoted", "fwd", proxy, []string{`Forwarded: for=[2001:db8:1:2::99]:80`}, client6},
		{"Forwarded IPv4-mapped", "fwd", proxy, []string{`Forwarded: for="[::ffff:198.51.100.1]"`}, client},
		{"Forwarded obfuscated port", "fwd", proxy, []string{`Forwarded: for="198.51.100.1:_p1"`}, client},
		{"Forwarded IPv6 obfuscated port", "fwd", proxy, []string{`Forwarded: for="[2001:db8:1:2::99]:_p1"`}, client6},
		{"Forwarded other parameters", "fwd", proxy,
			[]string{`Forwarded: proto=https;For=198.51.100.1;by="[2001:db8:ffff::1]";host=example.com`}, client},
		{"Forwarded chain", "fwd", proxy, []string{"Forwarded: for=1.1.1.1, for=198.51.100.1, for=10.0.0.2;by=10.0.0.1"}, client},
		{"Forwarded several field lines", "fwd", proxy,
			[]string{"Forwarded: for=1.1.1.1", "Forwarded: for=198.51.100.1;proto=http", "Forwarded: for=10.0.0.2"}, client},
		{"Forwarded whitespace", "fwd", proxy, []string{"Forwarded:  for=198.51.100.1 ; proto=http ,\tfor=10.0.0.2 "}, client},
		{"Forwarded quoted comma", "fwd", proxy, []string{`Forwarded: for=198.51.100.1;ext="a,b", for=10.0.0.2`}, client},
		{"Forwarded escaped quote", "fwd", proxy, []string{`Forwarded: for=1.1.1.1, for=198.51.100.1;ext="x\",y"`}, client},
		{"Forwarded forged unterminated quote", "fwd", proxy, []string{`Forwarded: for="1.1.1.1, for=198.51.100.1`}, client},
		{"Forwarded every element trusted", "fwd", proxy, []string{"Forwarded: for=10.0.0.5, for=10.0.0.4"}, "ip:10.0.0.5"},
		{"Forwarded unknown", "fwd", proxy, []string{"Forwarded: for=1.1.1.1, for=unknown"}, "ip:10.0.0.1"},
		{"Forwarded obfuscated", "fwd", proxy, []string{"Forwarded: for=1.1.1.1, for=_hidden"}, "ip:10.0.0.1"},
		{"Forwarded obfuscated quoted", "fwd", proxy, []string{`Forwarded: for="_hidden:80"`}, "ip:10.0.0.1"},
		{"Forwarded without for", "fwd", proxy, []string{"Forwarded: for=1.1.1.1, proto=https"}, "ip:10.0.0.1"},
		{"Forwarded two for", "fwd", proxy, []string{"Forwarded: for=198.51.100.1;for=1.1.1.1"}, "ip:10.0.0.1"},
		{"Forwarded garbage after value", "fwd", proxy, []string{"Forwarded: for=198.51.100.1 garbage"}, "ip:10.0.0.1"},
		{"Forwarded unterminated quote", "fwd", proxy, []string{`Forwarded: for="198.51.100.1`}, "ip:10.0.0.1"},
		{"Forwarded leading zeros refused", "fwd", proxy, []string{"Forwarded: for=010.1.1.1"}, "ip:10.0.0.1"},
		{"Forwarded XFF ignored", "fwd", proxy, []string{"X-Forwarded-For: 1.1.1.1", "Forwarded: for=198.51.100.1"}, client},
		{"Forwarded missing", "fwd", proxy, []string{"X-Forwarded-For: 198.51.100.1"}, "ip:10.0.0.1"},

		// One address in a header the proxy sets.
		{"X-Real-IP", "real", proxy, []string{"X-Real-IP: 198.51.100.1"}, client},
		{"X-Real-IP whitespace", "real", proxy, []string{"X-Real-IP:  198.51.100.1\t"}, client},
		{"X-Real-IP IPv6", "real", proxy, []string{"X-Real-IP: 2001:db8:1:2::99"}, client6},
		{"X-Real-IP IPv4-mapped", "real", proxy, []string{"X-Real-IP: ::ffff:198.51.100.1"}, client},
		{"X-Real-IP last field line", "real", proxy, []string{"X-Real-IP: 1.1.1.1", "X-Real-IP: 198.51.100.1"}, client},
		{"X-Real-IP trusted address kept", "real", proxy, []string{"X-Real-IP: 10.0.0.7"}, "ip:10.0.0.7"},
		{"X-Real-IP list refused", "real", proxy, []string{"X-Real-IP: 198.51.100.1, 10.0.0.2"}, "ip:10.0.0.1"},
		{"X-Real-IP garbage", "real", proxy, []string{"X-Real-IP: garbage"}, "ip:10.0.0.1"},
		{"X-Real-IP empty", "real", proxy, []string{"X-Real-IP: "}, "ip:10.0.0.1"},
		{"X-Real-IP empty last field line", "real", proxy, []string{"X-Real-IP: 198.51.100.1", "X-Real-IP: "}, "ip:10.0.0.1"},
		{"X-Real-IP missing", "real", proxy, []string{"X-Forwarded-For: 198.51.100.1"}, "ip:10.0.0.1"},
		{"X-Real-IP over-long", "real", proxy, []string{"X-Real-IP: fe80::1%" + strings.Repeat("z", 9000)}, "ip:10.0.0.1"},
		{"CF-Connecting-IP", "cf", proxyV6, []string{"Cf-Connecting-Ip: 198.51.100.1"}, client},

		// A fixed number of hops.
		{"hops 1", "hops1", proxy, []string{"X-Forwarded-For: 1.1.1.1, 198.51.100.1"}, client},
		{"hops 1 trusted address kept", "hops1", proxy, []string{"X-Forwarded-For: 1.1.1.1, 10.0.0.7"}, "ip:10.0.0.7"},
		{"hops 2", "hops2", proxy, []string{"X-Forwarded-For: 1.1.1.1, 198.51.100.1, 203.0.113.99"}, client},
		{"hops 2 several field lines", "hops2", proxy,
			[]string{"X-Forwarded-For: 1.1.1.1, 198.51.100.1", "X-Forwarded-For: 203.0.113.99"}, client},
		{"hops 2 empty elements", "hops2", proxy, []string{"X-Forwarded-For: 198.51.100.1, , 203.0.113.99,"}, client},
		{"hops 2 too few", "hops2", proxy, []string{"X-Forwarded-For: 198.51.100.1"}, "ip:10.0.0.1"},
		{"hops 2 garbage at hop 1", "hops2", proxy, []string{"X-Forwarded-For: 198.51.100.1, garbage"}, "ip:10.0.0.1"},
		{"hops 2 garbage at hop 2", "hops2", proxy, []string{"X-Forwarded-For: 198.51.100.1, garbage, 203.0.113.99"}, "ip:10.0.0.1"},
		{"hops 2 garbage beyond", "hops2", proxy, []string{"X-Forwarded-For: garbage, 198.51.100.1, 203.0.113.99"}, client},
		{"hops 3 any peer", "hops3", untrusted, []string{"X-Forwarded-For: 1.1.1.1, 198.51.100.1, 10.0.0.3, 10.0.0.2"}, client},
		{"hops 3 IPv6 peer", "hops3", "[2001:db8:9::1]:1", []string{"X-Forwarded-For: 198.51.100.1, 10.0.0.3, 10.0.0.2"}, client},
	}
	kfs := map[string]keyfuncs.KeyFunc{}
	for name, opts := range ipConfigs {
		kfs[name] = mustClientIP(t, opts...)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kf, ok := kfs[tt.config]
			if !ok {
				t.Fatalf("no config %q", tt.config)
			}
			r := headerRequest(tt.remoteAddr, tt.header...)
			got, err := kf(r)
			if err != nil || got != tt.want {
				t.Errorf("%s: RemoteAddr %q, header %.200q: got %q, %v; want %q, nil", tt.config, tt.remoteAddr, tt.header, got, err, tt.want)
			}
			if r.RemoteAddr != tt.remoteAddr {
				t.Errorf("RemoteAddr changed to %q", r.RemoteAddr)
			}
			// The middleware resolves the same address.
			mw, err := keyfuncs.ClientIPMiddleware(ipConfigs[tt.config]...)
			if err != nil {
				t.Fatal(err)
			}
			var viaCtx string
			mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				viaCtx, _ = kf(r)
			})).ServeHTTP(httptest.NewRecorder(), headerRequest(tt.remoteAddr, tt.header...))
			if viaCtx != tt.want {
				t.Errorf("after ClientIPMiddleware: got %q, want %q", viaCtx, tt.want)
			}
		})
	}
	if len(tests) < 60 {
		t.Errorf("%d cases, want at least 60", len(tests))
	}
}

func TestClientIPBadRemoteAddr(t *testing.T) {
	for _, config := range []string{"peer", "xff", "fwd", "real", "hops3"} {
		for _, remoteAddr := range []string{"", "garbage", "010.0.0.1:80", "[10.0.0.1]:80", "10.0.0.1:99999"} {
			t.Run(config+"/"+remoteAddr, func(t *testing.T) {
				kf := mustClientIP(t, ipConfigs[config]...)
				r := headerRequest(remoteAddr, "X-Forwarded-For: 198.51.100.1", "Forwarded: for=198.51.100.1", "X-Real-IP: 198.51.100.1")
				got, err := kf(r)
				if !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
					t.Errorf("got %q, %v; want \"\", an error wrapping ErrNoKey", got, err)
				}
			})
		}
	}
}

func TestClientIPInvalidConfig(t *testing.T) {
	trust := keyfuncs.TrustProxies("10.0.0.0/8")
	xff := keyfuncs.FromXForwardedFor()
	tests := []struct {
		name string
		opts []keyfuncs.IPOption
		want string // in the error
	}{
		{"malformed CIDR", []keyfuncs.IPOption{keyfuncs.TrustProxies("10.0.0.0/8", "10.0.0.0/33"), xff}, `"10.0.0.0/33"`},
		{"leading zeros in CIDR", []keyfuncs.IPOption{keyfuncs.TrustProxies("010.0.0.0/8"), xff}, `"010.0.0.0/8"`},
		{"host name", []keyfuncs.IPOption{keyfuncs.TrustProxies("proxy.internal"), xff}, `"proxy.internal"`},
		{"empty network", []keyfuncs.IPOption{keyfuncs.TrustProxies(""), xff}, `TrustProxies ""`},
		{"zone", []keyfuncs.IPOption{keyfuncs.TrustProxies("fe80::1%eth0"), xff}, `"fe80::1%eth0"`},
		{"no networks", []keyfuncs.IPOption{keyfuncs.TrustProxies(), xff}, "at least one network"},
		{"two sources", []keyfuncs.IPOption{trust, xff, keyfuncs.FromForwarded()}, "FromXForwardedFor and FromForwarded"},
		{"same source twice", []keyfuncs.IPOption{trust, xff, xff}, "two sources"},
		{"header and hops", []keyfuncs.IPOption{trust, keyfuncs.FromHeader("X-Real-IP"), keyfuncs.TrustedHops(1)}, `FromHeader("X-Real-IP") and TrustedHops(1)`},
		{"bad header name", []keyfuncs.IPOption{trust, keyfuncs.FromHeader("X Real IP")}, `"X Real IP"`},
		{"header is X-Forwarded-For", []keyfuncs.IPOption{trust, keyfuncs.FromHeader("x-forwarded-for")}, "FromXForwardedFor"},
		{"header is Forwarded", []keyfuncs.IPOption{trust, keyfuncs.FromHeader("Forwarded")}, "FromForwarded"},
		{"hops 0", []keyfuncs.IPOption{trust, keyfuncs.TrustedHops(0)}, "TrustedHops 0"},
		{"hops over the cap", []keyfuncs.IPOption{trust, keyfuncs.TrustedHops(5), keyfuncs.MaxForwarded(4)}, "TrustedHops(5) is more than MaxForwarded 4"},
		{"hops over the default cap", []keyfuncs.IPOption{trust, keyfuncs.TrustedHops(21)}, "MaxForwarded 20"},
		{"MaxForwarded 0", []keyfuncs.IPOption{trust, xff, keyfuncs.MaxForwarded(0)}, "MaxForwarded 0"},
		{"MaxForwarded 257", []keyfuncs.IPOption{trust, xff, keyfuncs.MaxForwarded(257)}, "MaxForwarded 257"},
		{"MaxForwarded without a list", []keyfuncs.IPOption{trust, keyfuncs.FromHeader("X-Real-IP"), keyfuncs.MaxForwarded(5)}, "MaxForwarded needs"},
		{"MaxForwarded without a source", []keyfuncs.IPOption{keyfuncs.MaxForwarded(5)}, "MaxForwarded needs"},
		{"IPv6Prefix 0", []keyfuncs.IPOption{keyfuncs.IPv6Prefix(0)}, "IPv6Prefix 0"},
		{"IPv6Prefix 129", []keyfuncs.IPOption{keyfuncs.IPv6Prefix(129)}, "IPv6Prefix 129"},
		{"IPv4Prefix 0", []keyfuncs.IPOption{keyfuncs.IPv4Prefix(0)}, "IPv4Prefix 0"},
		{"IPv4Prefix 33", []keyfuncs.IPOption{keyfuncs.IPv4Prefix(33)}, "IPv4Prefix 33"},
		{"zero option", []keyfuncs.IPOption{{}}, "zero IPOption"},
		// A source without TrustProxies would never read its header.
		{"XFF, trusting nobody", []keyfuncs.IPOption{xff}, "FromXForwardedFor reads a header only proxies may write, but no proxy is trusted: add TrustProxies"},
		{"Forwarded, trusting nobody", []keyfuncs.IPOption{keyfuncs.FromForwarded()}, "FromForwarded reads"},
		{"header, trusting nobody", []keyfuncs.IPOption{keyfuncs.FromHeader("X-Real-IP")}, `FromHeader("X-Real-IP") reads`},
		{"hops, trusting nobody", []keyfuncs.IPOption{keyfuncs.TrustedHops(2)}, "TrustedHops(2) reads"},
		// Without a source nothing is read: each client behind a trusted proxy would get its key.
		{"trust, no source", []keyfuncs.IPOption{keyfuncs.TrustProxies("10.0.0.0/8")}, "TrustProxies without a source reads no header"},
		{"trust unix, no source", []keyfuncs.IPOption{keyfuncs.TrustProxies("unix")}, "TrustProxies without a source"},
		// The hint for a walk never suggests trusting every address (see below).
		{"XFF hint", []keyfuncs.IPOption{xff}, "cannot be listed: TrustedHops(n)"},
		// Trusting every address, a walk would end at the element the client wrote.
		{"XFF trusting 0.0.0.0/0", []keyfuncs.IPOption{keyfuncs.TrustProxies("10.0.0.0/8", "0.0.0.0/0"), xff}, "FromXForwardedFor with a trusted network of every address"},
		{"Forwarded trusting ::/0", []keyfuncs.IPOption{keyfuncs.TrustProxies("::/0"), keyfuncs.FromForwarded()}, "FromForwarded with a trusted network of every address"},
		{"XFF trusting every mapped address", []keyfuncs.IPOption{keyfuncs.TrustProxies("::ffff:0.0.0.0/96"), xff}, "every address"},
		// It would trust IPv6 addresses (::1), not the IPv4 ones it names.
		{"short IPv4-mapped network", []keyfuncs.IPOption{keyfuncs.TrustProxies("::ffff:0:0/80"), xff}, `"::ffff:0:0/80": an IPv4-mapped network shorter than /96`},
		{"short IPv4-mapped network /8", []keyfuncs.IPOption{keyfuncs.TrustProxies("::ffff:10.0.0.0/8"), xff}, "shorter than /96"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kf, err := keyfuncs.ClientIP(tt.opts...)
			if !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
				t.Fatalf("ClientIP = %p, %v; want nil, an error wrapping ErrInvalidConfig", kf, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %s", err, tt.want)
			}
			mw, err := keyfuncs.ClientIPMiddleware(tt.opts...)
			if !errors.Is(err, keyfuncs.ErrInvalidConfig) || mw != nil {
				t.Errorf("ClientIPMiddleware = %p, %v; want nil, an error wrapping ErrInvalidConfig", mw, err)
			}
		})
	}
}

func TestClientIPValidConfig(t *testing.T) {
	for name, opts := range map[string][]keyfuncs.IPOption{
		"none":                       nil,
		"TrustProxies accumulates":   {keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.TrustProxies("2001:db8::/32"), keyfuncs.FromForwarded()},
		"unmasked network":           {keyfuncs.TrustProxies("10.1.2.3/8"), keyfuncs.FromXForwardedFor()},
		"hops at the cap":            {keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.TrustedHops(4), keyfuncs.MaxForwarded(4)},
		"MaxForwarded 256":           {keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromXForwardedFor(), keyfuncs.MaxForwarded(256)},
		"prefix options, last wins":  {keyfuncs.IPv6Prefix(48), keyfuncs.IPv6Prefix(56), keyfuncs.IPv4Prefix(24)},
		"trust everyone explicitly":  {keyfuncs.TrustProxies("0.0.0.0/0", "::/0"), keyfuncs.FromHeader("Fly-Client-IP")},
		"True-Client-IP lower case":  {keyfuncs.TrustProxies("10.0.0.1"), keyfuncs.FromHeader("true-client-ip")},
		"bare IPv6 proxy":            {keyfuncs.TrustProxies("2001:db8::1"), keyfuncs.FromXForwardedFor()},
		"IPv4-mapped bare proxy":     {keyfuncs.TrustProxies("::ffff:10.0.0.1"), keyfuncs.FromXForwardedFor()},
		"IPv4-mapped network /104":   {keyfuncs.TrustProxies("::ffff:10.0.0.0/104"), keyfuncs.FromXForwardedFor()},
		"every peer, by hops":        {keyfuncs.TrustProxies("0.0.0.0/0", "::/0"), keyfuncs.TrustedHops(1)},
		"header with hops and cap 1": {keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.TrustedHops(1), keyfuncs.MaxForwarded(1)},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := keyfuncs.ClientIP(opts...); err != nil {
				t.Errorf("ClientIP: %v; want no error", err)
			}
		})
	}

	t.Run("trust is opt-in: no TrustProxies reads no header", func(t *testing.T) {
		kf := mustClientIP(t) // no source, no trust: the peer
		for _, h := range []string{"X-Forwarded-For: 198.51.100.1", "Forwarded: for=198.51.100.1", "X-Real-IP: 198.51.100.1"} {
			if got, err := kf(headerRequest("10.0.0.1:1", h)); err != nil || got != "ip:10.0.0.1" {
				t.Errorf("%s: got %q, %v; want the peer ip:10.0.0.1", h, got, err)
			}
		}
	})
	t.Run("IPv4-mapped networks trust IPv4 peers", func(t *testing.T) {
		for _, nets := range [][]string{{"::ffff:10.0.0.1"}, {"::ffff:10.0.0.0/100"}, {"::ffff:10.0.0.0/104"}} {
			kf := mustClientIP(t, keyfuncs.TrustProxies(nets...), keyfuncs.FromXForwardedFor())
			for _, peer := range []string{"10.0.0.1:1", "[::ffff:10.0.0.1]:1"} {
				got, err := kf(headerRequest(peer, "X-Forwarded-For: 198.51.100.1"))
				if err != nil || got != "ip:198.51.100.1" {
					t.Errorf("TrustProxies(%q), peer %s: got %q, %v; want ip:198.51.100.1", nets, peer, got, err)
				}
			}
		}
	})
	t.Run("the caller's slice is copied", func(t *testing.T) {
		nets := []string{"10.0.0.0/8"}
		opt := keyfuncs.TrustProxies(nets...)
		nets[0] = "garbage"
		kf := mustClientIP(t, opt, keyfuncs.FromXForwardedFor())
		if got, _ := kf(headerRequest(proxy, "X-Forwarded-For: 198.51.100.1")); got != "ip:198.51.100.1" {
			t.Errorf("got %q, want ip:198.51.100.1", got)
		}
	})
}

// TestClientIPEvasion: a client cannot get a fresh key per request, by
// forging headers or by rotating its IPv6 address within its /64.
func TestClientIPEvasion(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	randIPv4 := func() string {
		return netip.AddrFrom4([4]byte{byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256)), byte(rng.IntN(256))}).String()
	}
	randIPv6 := func() string {
		var b [16]byte
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return netip.AddrFrom16(b).String()
	}
	forged := func() []string {
		a, b := randIPv4(), randIPv6()
		return []string{
			"X-Forwarded-For: " + a + ", " + b,
			"X-Forwarded-For: " + randIPv4(),
			`Forwarded: for="[` + b + `]", for=` + a,
			"X-Real-IP: " + a,
			"Cf-Connecting-Ip: " + b,
			"True-Client-IP: " + a,
			"Fly-Client-IP: " + a,
			"X-Client-IP: " + a,
		}
	}

	t.Run("untrusted client with forged headers", func(t *testing.T) {
		for name, opts := range ipConfigs {
			if name == "hops3" {
				continue // trusts every peer
			}
			kf := mustClientIP(t, opts...)
			for _, peer := range []string{untrusted, "[2001:db8:9::1]:1", "[::ffff:203.0.113.7]:1"} {
				want, err := kf(request(peer))
				if err != nil {
					t.Fatal(err)
				}
				for range 50 {
					got, err := kf(headerRequest(peer, forged()...))
					if err != nil || got != want {
						t.Fatalf("%s, peer %s with forged headers: got %q, %v; want %q, as without them", name, peer, got, err, want)
					}
				}
			}
		}
	})

	t.Run("client behind a trusted proxy that appends", func(t *testing.T) {
		for _, config := range []string{"xff", "fwd", "hops1"} {
			kf := mustClientIP(t, ipConfigs[config]...)
			const real = "198.51.100.1"
			for range 50 {
				// The client forges its own header; the proxy appends the
				// address it received the request from.
				var lines []string
				for _, l := range forged() {
					if config == "fwd" && strings.HasPrefix(l, "Forwarded:") || config != "fwd" && strings.HasPrefix(l, "X-Forwarded-For:") {
						lines = append(lines, l)
					}
				}
				if config == "fwd" {
					lines[len(lines)-1] += ", for=" + real
				} else {
					lines[len(lines)-1] += ", " + real
				}
				got, err := kf(headerRequest(proxy, lines...))
				if err != nil || got != "ip:"+real {
					t.Fatalf("%s, lines %q: got %q, %v; want ip:%s", config, lines, got, err, real)
				}
			}
		}
	})

	t.Run("IPv6 rotation within one /64", func(t *testing.T) {
		for _, c := range []struct {
			config string
			bits   int
		}{{"peer", 64}, {"xff", 64}, {"xff/56", 56}, {"xff/48", 48}} {
			kf := mustClientIP(t, ipConfigs[c.config]...)
			base := netip.MustParsePrefix("2001:db8:1:2::/64")
			keys := map[string]bool{}
			for range 200 {
				b := base.Addr().As16()
				for i := 8; i < 16; i++ {
					b[i] = byte(rng.IntN(256))
				}
				addr := netip.AddrFrom16(b)
				var r *http.Request
				if c.config == "peer" {
					r = request(netip.AddrPortFrom(addr, uint16(rng.IntN(65536))).String())
				} else {
					r = headerRequest(proxy, "X-Forwarded-For: "+addr.String())
				}
				k, err := kf(r)
				if err != nil {
					t.Fatal(err)
				}
				keys[k] = true
			}
			want := "ip:" + netip.PrefixFrom(base.Addr(), c.bits).Masked().String()
			if len(keys) != 1 || !keys[want] {
				t.Errorf("%s: 200 addresses of one /64 got keys %v; want only %q", c.config, keys, want)
			}
		}
	})

	t.Run("different /64s differ", func(t *testing.T) {
		kf := mustClientIP(t, ipConfigs["xff"]...)
		a, _ := kf(headerRequest(proxy, "X-Forwarded-For: 2001:db8:1:2::1"))
		b, _ := kf(headerRequest(proxy, "X-Forwarded-For: 2001:db8:1:3::1"))
		if a == b {
			t.Errorf("got %q for both, want different keys", a)
		}
	})
}

// TestClientIPLockOut: a header naming a victim's address never moves the
// sender into the victim's bucket.
func TestClientIPLockOut(t *testing.T) {
	const victim, attacker = "198.51.100.1", "203.0.113.66"
	// Each case: how the attacker's request reaches the server, and the
	// key it must get.
	tests := []struct {
		name, config, remoteAddr string
		header                   []string
		want                     string
	}{
		{"direct, XFF", "xff", attacker + ":1", []string{"X-Forwarded-For: " + victim}, "ip:" + attacker},
		{"direct, Forwarded", "fwd", attacker + ":1", []string{"Forwarded: for=" + victim}, "ip:" + attacker},
		{"direct, X-Real-IP", "real", attacker + ":1", []string{"X-Real-IP: " + victim}, "ip:" + attacker},
		{"direct, hops", "hops1", attacker + ":1", []string{"X-Forwarded-For: " + victim}, "ip:" + attacker},
		{"appending proxy, XFF", "xff", proxy, []string{"X-Forwarded-For: " + victim + ", " + attacker}, "ip:" + attacker},
		{"appending proxy, XFF line", "xff", proxy,
			[]string{"X-Forwarded-For: " + victim, "X-Forwarded-For: " + attacker}, "ip:" + attacker},
		{"appending proxy, XFF with trusted-looking forgery", "xff", proxy,
			[]string{"X-Forwarded-For: " + victim + ", 10.0.0.2, " + attacker}, "ip:" + attacker},
		{"appending proxy, XFF padded past the caps", "xff", proxy,
			[]string{"X-Forwarded-For: " + victim + strings.Repeat(", 10.0.0.2", 2000) + ", " + attacker}, "ip:" + attacker},
		{"appending proxy, Forwarded", "fwd", proxy, []string{"Forwarded: for=" + victim + ", for=" + attacker}, "ip:" + attacker},
		{"appending proxy, Forwarded with open quote", "fwd", proxy,
			[]string{`Forwarded: for="` + victim + `, for=` + attacker}, "ip:" + attacker},
		{"appending proxy, hops", "hops1", proxy, []string{"X-Forwarded-For: " + victim + ", " + attacker}, "ip:" + attacker},
		{"two proxies, hops", "hops2", proxy,
			[]string{"X-Forwarded-For: " + victim + ", " + attacker + ", 203.0.113.200"}, "ip:" + attacker},
		{"overwriting proxy", "real", proxy, []string{"X-Real-IP: " + attacker}, "ip:" + attacker},
		{"proxy that adds its X-Real-IP line", "real", proxy,
			[]string{"X-Real-IP: " + victim, "X-Real-IP: " + attacker}, "ip:" + attacker},
		{"XFF forged, Forwarded read", "fwd", proxy,
			[]string{"X-Forwarded-For: " + victim, "Forwarded: for=" + attacker}, "ip:" + attacker},
		{"garbage appended by the proxy", "xff", proxy, []string{"X-Forwarded-For: " + victim + ", garbage"}, "ip:10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kf := mustClientIP(t, ipConfigs[tt.config]...)
			got, err := kf(headerRequest(tt.remoteAddr, tt.header...))
			if err != nil || got != tt.want {
				t.Errorf("got %q, %v; want %q", got, err, tt.want)
			}
			if got == "ip:"+victim {
				t.Errorf("the attacker got the victim's key %q", got)
			}
		})
	}

	t.Run("the victim is not refused", func(t *testing.T) {
		// A limit of 10 requests per key, counted in a map in the place
		// of a store: the attacker floods with the victim's address, then
		// the victim comes through the same proxy.
		kf := mustClientIP(t, ipConfigs["xff"]...)
		counts := map[string]int{}
		allow := func(r *http.Request) bool {
			k, err := kf(r)
			if err != nil {
				t.Fatal(err)
			}
			counts[k]++
			return counts[k] <= 10
		}
		for range 100 {
			allow(headerRequest(proxy, "X-Forwarded-For: "+victim+", "+attacker))
			allow(headerRequest(attacker+":1", "X-Forwarded-For: "+victim))
		}
		if !allow(headerRequest(proxy, "X-Forwarded-For: "+victim)) {
			t.Errorf("the victim was refused; counts %v", counts)
		}
		if allow(headerRequest(proxy, "X-Forwarded-For: "+attacker)) {
			t.Errorf("the attacker was allowed; counts %v", counts)
		}
	})
}

func TestClientIPMiddleware(t *testing.T) {
	opts := ipConfigs["xff"]
	mw, err := keyfuncs.ClientIPMiddleware(opts...)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(r *http.Request, h http.HandlerFunc) {
		t.Helper()
		mw(h).ServeHTTP(httptest.NewRecorder(), r)
	}

	t.Run("handlers read the address", func(t *testing.T) {
		for _, c := range []struct {
			remoteAddr, xff, want string
		}{
			{proxy, "1.1.1.1, 2001:db8:1:2::99, 10.0.0.2", "2001:db8:1:2::99"},
			{proxy, "[fe80::1%eth0]:80", "fe80::1"},
			{proxy, "::ffff:198.51.100.1", "198.51.100.1"},
			{proxy, "garbage", "10.0.0.1"},
			{untrusted, "198.51.100.1", "203.0.113.7"},
			{"[::ffff:203.0.113.7]:1", "198.51.100.1", "203.0.113.7"},
		} {
			r := headerRequest(c.remoteAddr, "X-Forwarded-For: "+c.xff)
			called := false
			serve(r, func(w http.ResponseWriter, r *http.Request) {
				called = true
				addr, ok := keyfuncs.ClientAddr(r.Context())
				if !ok || addr.String() != c.want {
					t.Errorf("%s, XFF %q: ClientAddr = %v, %v; want %s, true", c.remoteAddr, c.xff, addr, ok, c.want)
				}
				if r.RemoteAddr != c.remoteAddr {
					t.Errorf("RemoteAddr = %q, want %q unchanged", r.RemoteAddr, c.remoteAddr)
				}
				if got := r.Header.Get("X-Forwarded-For"); got != c.xff {
					t.Errorf("X-Forwarded-For = %q, want %q unchanged", got, c.xff)
				}
			})
			if !called {
				t.Errorf("the next handler was not called")
			}
		}
	})

	t.Run("no address outside the middleware", func(t *testing.T) {
		if addr, ok := keyfuncs.ClientAddr(context.Background()); ok || addr.IsValid() {
			t.Errorf("ClientAddr = %v, %v; want the zero Addr, false", addr, ok)
		}
	})

	t.Run("bad RemoteAddr: no address, next still called", func(t *testing.T) {
		called := false
		serve(headerRequest("garbage", "X-Forwarded-For: 198.51.100.1"), func(w http.ResponseWriter, r *http.Request) {
			called = true
			if addr, ok := keyfuncs.ClientAddr(r.Context()); ok {
				t.Errorf("ClientAddr = %v, true; want false", addr)
			}
		})
		if !called {
			t.Errorf("the next handler was not called")
		}
	})

	t.Run("ClientIP reuses the stored address", func(t *testing.T) {
		// Two KeyFuncs built from separate but equal options, and one
		// with other prefix lengths, which do not change the address.
		same := []keyfuncs.KeyFunc{
			mustClientIP(t, keyfuncs.TrustProxies(trustedNets...), keyfuncs.FromXForwardedFor()),
			mustClientIP(t, append(slices.Clone(opts), keyfuncs.IPv6Prefix(128))...),
		}
		other := mustClientIP(t, keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromXForwardedFor()) // other networks
		serve(headerRequest(proxy, "X-Forwarded-For: 2001:db8:1:2::99"), func(w http.ResponseWriter, r *http.Request) {
			// Change what the KeyFuncs would read: those that reuse the
			// stored address do not see it.
			r.Header.Set("X-Forwarded-For", "198.51.100.1")
			for i, want := range []string{"ip:2001:db8:1:2::/64", "ip:2001:db8:1:2::99"} {
				if got, err := same[i](r); err != nil || got != want {
					t.Errorf("same options %d: got %q, %v; want %q (stored)", i, got, err, want)
				}
			}
			if got, err := other(r); err != nil || got != "ip:198.51.100.1" {
				t.Errorf("other options: got %q, %v; want ip:198.51.100.1 (resolved again)", got, err)
			}
		})
	})
}

// clientIPKey, clientIPFromXFF and getClientIP stand in for chi v5.3's
// middleware.ClientIPFromXFF and middleware.GetClientIP (this module
// requires chi v5.2.3, which has neither): the middleware stores a
// netip.Addr under a private context key, the getter returns it as a
// string, "" when there is none.
type clientIPKey struct{}

func clientIPFromXFF(trusted ...string) func(http.Handler) http.Handler {
	prefixes := make([]netip.Prefix, len(trusted))
	for i, p := range trusted {
		prefixes[i] = netip.MustParsePrefix(p)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			xff := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
			for i := len(xff) - 1; i >= 0; i-- {
				ip, err := netip.ParseAddr(strings.TrimSpace(xff[i]))
				if err != nil {
					continue
				}
				ip = ip.Unmap().WithZone("")
				if !inPrefixes(prefixes, ip) {
					r = r.WithContext(context.WithValue(r.Context(), clientIPKey{}, ip))
					break
				}
			}
			next.ServeHTTP(w, r)
		})
	}
}

func inPrefixes(prefixes []netip.Prefix, ip netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func getClientIP(ctx context.Context) string {
	ip, _ := ctx.Value(clientIPKey{}).(netip.Addr)
	if !ip.IsValid() {
		return ""
	}
	return ip.String()
}

func TestClientIPFromContext(t *testing.T) {
	value := func(s string) func(context.Context) string {
		return func(context.Context) string { return s }
	}
	for _, c := range []struct {
		s, want string
	}{
		{"198.51.100.1", "ip:198.51.100.1"},
		{"198.51.100.1:80", "ip:198.51.100.1"},
		{"2001:db8:1:2::99", "ip:2001:db8:1:2::/64"},
		{"[2001:db8:1:2::99]:443", "ip:2001:db8:1:2::/64"},
		{"[2001:db8:1:2::99]", "ip:2001:db8:1:2::/64"},
		{"fe80::1%eth0", "ip:fe80::/64"},
		{"::ffff:198.51.100.1", "ip:198.51.100.1"},
	} {
		kf, err := keyfuncs.ClientIPFromContext(value(c.s))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := kf(request("10.0.0.1:1")); err != nil || got != c.want {
			t.Errorf("%q: got %q, %v; want %q", c.s, got, err, c.want)
		}
	}

	t.Run("prefixes", func(t *testing.T) {
		kf, err := keyfuncs.ClientIPFromContext(value("::ffff:198.51.100.77"), keyfuncs.IPv4Prefix(24), keyfuncs.IPv6Prefix(48))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := kf(request("10.0.0.1:1")); err != nil || got != "ip:198.51.100.0/24" {
			t.Errorf("got %q, %v; want ip:198.51.100.0/24", got, err)
		}
	})

	for _, s := range []string{"", "garbage", "010.1.1.1", "[198.51.100.1]", "198.51.100.1, 10.0.0.1", " 198.51.100.1", strings.Repeat("x", 100)} {
		t.Run("no key "+fmt.Sprintf("%.20q", s), func(t *testing.T) {
			kf, err := keyfuncs.ClientIPFromContext(value(s))
			if err != nil {
				t.Fatal(err)
			}
			got, err := kf(request("10.0.0.1:1"))
			if !errors.Is(err, keyfuncs.ErrNoKey) || got != "" {
				t.Errorf("got %q, %v; want \"\", an error wrapping ErrNoKey", got, err)
			}
		})
	}

	for name, opts := range map[string][]keyfuncs.IPOption{
		"TrustProxies": {keyfuncs.TrustProxies("10.0.0.0/8")},
		"unix":         {keyfuncs.TrustProxies("unix")},
		"source":       {keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromXForwardedFor()},
		"bad prefix":   {keyfuncs.IPv6Prefix(0)},
	} {
		t.Run("invalid "+name, func(t *testing.T) {
			kf, err := keyfuncs.ClientIPFromContext(value("198.51.100.1"), opts...)
			if !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
				t.Errorf("got %p, %v; want nil, an error wrapping ErrInvalidConfig", kf, err)
			}
		})
	}
	t.Run("nil function", func(t *testing.T) {
		kf, err := keyfuncs.ClientIPFromContext(nil)
		if !errors.Is(err, keyfuncs.ErrInvalidConfig) || kf != nil {
			t.Errorf("got %p, %v; want nil, an error wrapping ErrInvalidConfig", kf, err)
		}
	})
}

// TestClientIPWithChi runs both ways of keying by client IP in a chi
// router: chi's own client-IP middleware (here its stand-in) with
// ClientIPFromContext, and ClientIPMiddleware with ClientIP.
func TestClientIPWithChi(t *testing.T) {
	fromChi, err := keyfuncs.ClientIPFromContext(getClientIP)
	if err != nil {
		t.Fatal(err)
	}
	opts := []keyfuncs.IPOption{keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromXForwardedFor()}
	mw, err := keyfuncs.ClientIPMiddleware(opts...)
	if err != nil {
		t.Fatal(err)
	}
	ours := mustClientIP(t, opts...)

	r := chi.NewRouter()
	r.Group(func(r chi.Router) {
		r.Use(clientIPFromXFF("10.0.0.0/8"))
		r.With(func(next http.Handler) http.Handler { return record("X-Key", fromChi, next) }).
			Get("/chi", func(w http.ResponseWriter, r *http.Request) {})
	})
	r.Group(func(r chi.Router) {
		r.Use(mw)
		r.With(func(next http.Handler) http.Handler { return record("X-Key", ours, next) }).
			Get("/ours", func(w http.ResponseWriter, r *http.Request) {
				addr, _ := keyfuncs.ClientAddr(r.Context())
				w.Header().Set("X-Client-Addr", addr.String())
			})
	})

	for _, c := range []struct {
		path, remoteAddr, xff, wantKey, wantAddr string
	}{
		{"/chi", proxy, "1.1.1.1, 2001:db8:1:2::99, 10.0.0.2", "ip:2001:db8:1:2::/64", ""},
		{"/chi", proxy, "::ffff:198.51.100.1", "ip:198.51.100.1", ""},
		{"/chi", proxy, "10.0.0.3", "ErrNoKey", ""}, // chi's finds no untrusted address
		{"/ours", proxy, "1.1.1.1, 2001:db8:1:2::99, 10.0.0.2", "ip:2001:db8:1:2::/64", "2001:db8:1:2::99"},
		{"/ours", proxy, "::ffff:198.51.100.1", "ip:198.51.100.1", "198.51.100.1"},
		{"/ours", untrusted, "198.51.100.1", "ip:203.0.113.7", "203.0.113.7"},
	} {
		req := headerRequest(c.remoteAddr, "X-Forwarded-For: "+c.xff)
		req.URL.Path = c.path
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if got := w.Header().Get("X-Key"); got != c.wantKey {
			t.Errorf("%s, XFF %q: key %q, want %q", c.path, c.xff, got, c.wantKey)
		}
		if got := w.Header().Get("X-Client-Addr"); got != c.wantAddr {
			t.Errorf("%s, XFF %q: ClientAddr %q, want %q", c.path, c.xff, got, c.wantAddr)
		}
	}
}

func BenchmarkClientIP(b *testing.B) {
	trust := keyfuncs.TrustProxies("10.0.0.0/8", "172.16.0.0/12", "2001:db8:ffff::/48")
	xff := mustClientIP(b, trust, keyfuncs.FromXForwardedFor())
	fwd := mustClientIP(b, trust, keyfuncs.FromForwarded())
	real := mustClientIP(b, trust, keyfuncs.FromHeader("X-Real-IP"))
	hops := mustClientIP(b, trust, keyfuncs.TrustedHops(5))
	mw, err := keyfuncs.ClientIPMiddleware(trust, keyfuncs.FromXForwardedFor())
	if err != nil {
		b.Fatal(err)
	}
	// Five hops: the client, then four proxies, all trusted; the peer is a
	// fifth.
	const chain = "2001:db8:1:2::99, 10.0.0.4, 172.16.0.3, 10.0.0.2, 10.0.0.1"
	stored := headerRequest("10.0.0.9:443", "X-Forwarded-For: "+chain)
	mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { stored = r })).ServeHTTP(nil, stored)

	for _, bc := range []struct {
		name string
		kf   keyfuncs.KeyFunc
		r    *http.Request
	}{
		{"peer", mustClientIP(b), request("198.51.100.1:54321")},
		{"untrusted-with-XFF", xff, headerRequest("203.0.113.7:1", "X-Forwarded-For: "+chain)},
		{"XFF-1-hop", xff, headerRequest("10.0.0.9:443", "X-Forwarded-For: 198.51.100.1")},
		{"XFF-5-hops", xff, headerRequest("10.0.0.9:443", "X-Forwarded-For: "+chain)},
		{"XFF-5-hops-5-lines", xff, headerRequest("10.0.0.9:443", "X-Forwarded-For: 2001:db8:1:2::99",
			"X-Forwarded-For: 10.0.0.4", "X-Forwarded-For: 172.16.0.3", "X-Forwarded-For: 10.0.0.2", "X-Forwarded-For: 10.0.0.1")},
		{"Forwarded-5-hops", fwd, headerRequest("10.0.0.9:443",
			`Forwarded: for="[2001:db8:1:2::99]:4711";proto=https, for=10.0.0.4, for=172.16.0.3, for=10.0.0.2, for=10.0.0.1`)},
		{"TrustedHops-5", hops, headerRequest("10.0.0.9:443", "X-Forwarded-For: "+chain)},
		{"X-Real-IP", real, headerRequest("10.0.0.9:443", "X-Real-IP: 198.51.100.1")},
		{"XFF-5-hops-stored", xff, stored},
		{"XFF-over-long", xff, headerRequest("10.0.0.9:443", "X-Forwarded-For: "+strings.Repeat("10.0.0.3, ", 2000)+"10.0.0.2")},
	} {
		if k, err := bc.kf(bc.r); err != nil || !strings.HasPrefix(k, "ip:") {
			b.Fatalf("%s: %q, %v", bc.name, k, err)
		}
		b.Run(bc.name+"/serial", func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				bc.kf(bc.r)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bc.kf(bc.r)
				}
			})
		})
	}
	b.Run("middleware-XFF-5-hops/serial", func(b *testing.B) {
		h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
		r := headerRequest("10.0.0.9:443", "X-Forwarded-For: "+chain)
		b.ReportAllocs()
		for range b.N {
			h.ServeHTTP(nil, r)
		}
	})
}

// fuzzConfigs are the configurations FuzzClientIP runs, picked by its mode
// byte: the source, and the TrustedHops count or MaxForwarded cap.
var fuzzConfigs = []struct {
	source string // "", "xff", "fwd", "real", "hops"
	n      int    // hops: TrustedHops(n); xff: MaxForwarded(n), 0 for the default
}{
	{"", 0}, {"xff", 0}, {"xff", 3}, {"fwd", 0}, {"fwd", 2}, {"real", 0}, {"hops", 1}, {"hops", 2}, {"hops", 3},
}

// FuzzClientIP checks that the resolver never panics and always answers
// either an error wrapping ErrNoKey, exactly when RemoteAddr does not parse,
// or a well-formed "ip:" key of the peer or of an address that appears in
// the header; that an untrusted peer always gets its own key; that
// X-Forwarded-For walks agree with a slow reference; and that
// ClientIPMiddleware stores the same address. value is split at '\n' into
// field lines, set as X-Forwarded-For, Forwarded and X-Real-IP alike.
func FuzzClientIP(f *testing.F) {
	for _, s := range []struct {
		mode              uint8
		remoteAddr, value string
	}{
		{0, "198.51.100.1:1234", ""},
		{1, proxy, "198.51.100.1, 10.0.0.2"},
		{1, proxy, "1.1.1.1, 198.51.100.1\n10.0.0.2"},
		{1, proxyV6, " , 2001:db8:1:2::99 ,\t[2001:db8:ffff::2]:80,"},
		{1, untrusted, "198.51.100.1"},
		{1, proxy, "10.0.0.5, 10.0.0.4"},
		{1, proxy, "198.51.100.1, garbage, 10.0.0.2"},
		{1, proxy, "::ffff:198.51.100.1, ::ffff:10.0.0.9"},
		{1, "[::ffff:172.16.0.5]:1", "fe80::1%eth0"},
		{2, proxy, "198.51.100.1, 10.0.0.4, 10.0.0.3, 10.0.0.2"},
		{3, proxy, `for=1.1.1.1, for="[2001:db8:1:2::99]:4711";proto=https, For=10.0.0.2`},
		{3, proxy, `for="198.51.100.1:_p";by=_x, for=unknown`},
		{3, proxy, `for="1.1.1.1, for=198.51.100.1;ext="x\",y"`},
		{4, proxy, "for=_hidden\nfor=198.51.100.1"},
		{5, proxy, "198.51.100.1"},
		{5, proxy, "1.1.1.1\n 2001:db8:1:2::99 "},
		{6, proxy, "1.1.1.1, 198.51.100.1"},
		{7, proxy, "1.1.1.1, 198.51.100.1, 203.0.113.99"},
		{8, untrusted, "198.51.100.1,,10.0.0.3, 10.0.0.2"},
		{1, proxy, "010.1.1.1"},
		{1, proxy, strings.Repeat("10.0.0.3,", 1000) + "198.51.100.1"},
		{1, "garbage", "198.51.100.1"},
		{1, "[::ffff:172.17.0.0]", "::% 0"}, // a zone (dropped) with a space
	} {
		f.Add(s.mode, s.remoteAddr, s.value)
	}

	type fuzzConfig struct {
		full, grouped keyfuncs.KeyFunc // /32 /128 and /32 /64
		mw            func(http.Handler) http.Handler
	}
	configs := make([]fuzzConfig, len(fuzzConfigs))
	for i, c := range fuzzConfigs {
		var opts []keyfuncs.IPOption
		if c.source != "" {
			opts = append(opts, keyfuncs.TrustProxies(trustedNets...))
		}
		switch c.source {
		case "xff":
			opts = append(opts, keyfuncs.FromXForwardedFor())
		case "fwd":
			opts = append(opts, keyfuncs.FromForwarded())
		case "real":
			opts = append(opts, keyfuncs.FromHeader("X-Real-IP"))
		case "hops":
			opts = append(opts, keyfuncs.TrustedHops(c.n))
		}
		if c.n > 0 && c.source != "hops" {
			opts = append(opts, keyfuncs.MaxForwarded(c.n))
		}
		mw, err := keyfuncs.ClientIPMiddleware(opts...)
		if err != nil {
			f.Fatal(err)
		}
		configs[i] = fuzzConfig{
			full:    mustClientIP(f, append(slices.Clone(opts), keyfuncs.IPv6Prefix(128))...),
			grouped: mustClientIP(f, opts...),
			mw:      mw,
		}
	}
	// The trusted networks as ClientIP reads them (the mapped one unmapped).
	trusted := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48"),
		netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("172.16.0.0/12"),
	}
	fullPeer, err := keyfuncs.PeerIPPrefix(32, 128)
	if err != nil {
		f.Fatal(err)
	}
	// parse reads one address in the forms of RemoteAddr, through PeerIP.
	parse := func(s string) (netip.Addr, bool) {
		k, err := fullPeer(&http.Request{RemoteAddr: s})
		if err != nil {
			return netip.Addr{}, false
		}
		return netip.MustParseAddr(strings.TrimPrefix(k, "ip:")), true
	}

	f.Fuzz(func(t *testing.T, mode uint8, remoteAddr, value string) {
		fc := fuzzConfigs[int(mode)%len(fuzzConfigs)]
		c := configs[int(mode)%len(fuzzConfigs)]
		lines := strings.Split(value, "\n")
		r := &http.Request{RemoteAddr: remoteAddr, Header: http.Header{
			"X-Forwarded-For": lines, "Forwarded": lines, "X-Real-Ip": lines,
		}}
		full, err := c.full(r)
		grouped, gerr := c.grouped(r)
		peer, peerOK := parse(remoteAddr)
		if !peerOK {
			if !errors.Is(err, keyfuncs.ErrNoKey) || full != "" || !errors.Is(gerr, keyfuncs.ErrNoKey) || grouped != "" {
				t.Fatalf("RemoteAddr %q: got %q, %v and %q, %v; want errors wrapping ErrNoKey", remoteAddr, full, err, grouped, gerr)
			}
			return
		}
		if err != nil || gerr != nil {
			t.Fatalf("RemoteAddr %q: errors %v, %v; want keys", remoteAddr, err, gerr)
		}
		checkIPKey(t, remoteAddr, full, 32, 128)
		checkIPKey(t, remoteAddr, grouped, 32, 64)
		addr := netip.MustParseAddr(strings.TrimPrefix(full, "ip:"))
		if want := referenceKey(addr, 32, 64); grouped != want {
			t.Fatalf("/64 key %q and /128 key %q disagree; want %q", grouped, full, want)
		}

		peerTrusted := slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Contains(peer) })
		if fc.source == "" || !peerTrusted {
			if addr != peer {
				t.Fatalf("%+v, peer %q (untrusted or no source), value %q: got %s, want the peer %s", fc, remoteAddr, value, addr, peer)
			}
		} else if addr != peer && !appearsIn(value, addr, parse) {
			t.Fatalf("%+v, peer %q, value %q: got %s, which is neither the peer nor in the header", fc, remoteAddr, value, addr)
		}

		// X-Forwarded-For against a slow reference, when the 8 KiB window
		// holds the whole header.
		if peerTrusted && (fc.source == "xff" || fc.source == "hops") && len(value) <= 8192-len(lines) {
			hops, max := 0, keyfuncs.DefaultMaxForwarded
			if fc.source == "hops" {
				hops = fc.n
			} else if fc.n > 0 {
				max = fc.n
			}
			want := referenceXFF(lines, peer, trusted, hops, max, parse)
			if addr != want {
				t.Fatalf("%+v, peer %q, X-Forwarded-For %q: got %s, want %s (reference)", fc, remoteAddr, lines, addr, want)
			}
		}

		var stored netip.Addr
		var storedOK bool
		c.mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			stored, storedOK = keyfuncs.ClientAddr(r.Context())
			if k, err := c.grouped(r); err != nil || k != grouped {
				t.Fatalf("after the middleware: got %q, %v; want %q", k, err, grouped)
			}
		})).ServeHTTP(nil, r)
		if !storedOK || stored != addr {
			t.Fatalf("ClientAddr = %s, %v; want %s, true", stored, storedOK, addr)
		}
	})
}

// appearsIn reports whether addr is the address of one of the pieces of
// value between the delimiters of X-Forwarded-For and Forwarded, read with
// parse, with an RFC 7239 obfuscated port dropped.
func appearsIn(value string, addr netip.Addr, parse func(string) (netip.Addr, bool)) bool {
	for _, seps := range []string{",;=\" \t\n", ",;=\"\n"} { // a zone may hold a space: "::% 0"
		for _, piece := range strings.FieldsFunc(value, func(r rune) bool { return strings.ContainsRune(seps, r) }) {
			piece = strings.Trim(piece, " \t")
			if a, ok := parse(piece); ok && a == addr {
				return true
			}
			if i := strings.LastIndex(piece, ":_"); i >= 0 {
				if a, ok := parse(piece[:i]); ok && a == addr {
					return true
				}
			}
		}
	}
	return false
}

// referenceXFF resolves X-Forwarded-For the slow, obvious way: split every
// field line at commas, trim, drop empty elements, then look from the right.
func referenceXFF(lines []string, peer netip.Addr, trusted []netip.Prefix, hops, max int, parse func(string) (netip.Addr, bool)) netip.Addr {
	var elems []string
	for _, l := range lines {
		for _, e := range strings.Split(l, ",") {
			if e = strings.Trim(e, " \t"); e != "" {
				elems = append(elems, e)
			}
		}
	}
	last := peer
	for n := 1; n <= len(elems); n++ {
		if n > max {
			return peer
		}
		a, ok := parse(elems[len(elems)-n])
		if !ok {
			return peer
		}
		if hops > 0 {
			if n == hops {
				return a
			}
		} else if !slices.ContainsFunc(trusted, func(p netip.Prefix) bool { return p.Contains(a) }) {
			return a
		}
		last = a
	}
	if hops > 0 {
		return peer
	}
	return last
}

// A proxy on the same host that reaches the server over a Unix socket
// (nginx's proxy_pass http://unix:...) is trusted by "unix": the peer has no
// address, so its header names the client, or the request has no key.
func TestClientIPUnixSocketPeer(t *testing.T) {
	real := mustClientIP(t, keyfuncs.TrustProxies("unix"), keyfuncs.FromHeader("X-Real-IP"))
	xff := mustClientIP(t, keyfuncs.TrustProxies("unix", "10.0.0.0/8"), keyfuncs.FromXForwardedFor())
	untrusted := mustClientIP(t, keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromHeader("X-Real-IP"))
	for _, tc := range []struct {
		name string
		kf   keyfuncs.KeyFunc
		r    *http.Request
		want string // "" for ErrNoKey
	}{
		{"X-Real-IP, Linux's unnamed peer", real, headerRequest("@", "X-Real-IP: 198.51.100.7"), "ip:198.51.100.7"},
		{"X-Real-IP, macOS's unnamed peer", real, headerRequest("", "X-Real-IP: 198.51.100.7"), "ip:198.51.100.7"},
		{"X-Real-IP, a named peer", real, headerRequest("/run/nginx.sock", "X-Real-IP: 198.51.100.7"), "ip:198.51.100.7"},
		{"no header", real, headerRequest("@"), ""},
		{"malformed header", real, headerRequest("@", "X-Real-IP: 198.51.100.7, 1.2.3.4"), ""},
		{"XFF past trusted proxies", xff, headerRequest("@", "X-Forwarded-For: 6.6.6.6, 203.0.113.9, 10.0.0.2"), "ip:203.0.113.9"},
		{"XFF malformed", xff, headerRequest("@", "X-Forwarded-For: 203.0.113.9, garbage"), ""},
		{"a TCP peer is not trusted by unix", real, headerRequest("192.0.2.1:5", "X-Real-IP: 198.51.100.7"), "ip:192.0.2.1"},
		{"a Unix peer without unix trust", untrusted, headerRequest("@", "X-Real-IP: 198.51.100.7"), ""},
	} {
		got, err := tc.kf(tc.r)
		if tc.want == "" && (!errors.Is(err, keyfuncs.ErrNoKey) || got != "") || tc.want != "" && (err != nil || got != tc.want) {
			t.Errorf("%s: %q, %v; want %q (empty: ErrNoKey)", tc.name, got, err, tc.want)
		}
	}

	// Over a real Unix socket.
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Skipf("no Unix sockets here: %v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := real(r)
		fmt.Fprintf(w, "%s %v", key, err)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", ln.Addr().String())
	}}}
	defer client.CloseIdleConnections()
	req, _ := http.NewRequest("GET", "http://nginx/", nil)
	req.Header.Set("X-Real-IP", "198.51.100.7")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "ip:198.51.100.7 <nil>" {
		t.Errorf("over a Unix socket: %q; want the header's client", body)
	}
}
