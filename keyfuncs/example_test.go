package keyfuncs_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/tollgate-go/tollgate/keyfuncs"
)

func ExamplePeerIP() {
	for _, remoteAddr := range []string{
		"192.0.2.1:54321",
		"[2001:db8:1:2:aaaa::1]:54321",
		"[2001:db8:1:2:bbbb::2]:443", // same /64, same key
		"[::ffff:192.0.2.1]:54321",   // IPv4-mapped: the IPv4 key
		"[fe80::1%eth0]:80",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remoteAddr
		key, err := keyfuncs.PeerIP(r)
		if err != nil {
			panic(err)
		}
		fmt.Println(key)
	}
	// Output:
	// ip:192.0.2.1
	// ip:2001:db8:1:2::/64
	// ip:2001:db8:1:2::/64
	// ip:192.0.2.1
	// ip:fe80::/64
}

func ExamplePeerIPPrefix() {
	kf, err := keyfuncs.PeerIPPrefix(24, 48)
	if err != nil {
		panic(err)
	}
	for _, remoteAddr := range []string{"192.0.2.77:54321", "[2001:db8:1:2::1]:54321"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remoteAddr
		key, _ := kf(r)
		fmt.Println(key)
	}

	_, err = keyfuncs.PeerIPPrefix(24, 0)
	fmt.Println(err)
	// Output:
	// ip:192.0.2.0/24
	// ip:2001:db8:1::/48
	// keyfuncs: invalid configuration: PeerIPPrefix v6Bits 0 is outside [1, 128]
}

func ExampleHeader() {
	kf, err := keyfuncs.Header("X-Api-Key")
	if err != nil {
		panic(err) // a header name that is not a token
	}

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Api-Key", "sk_live_123")
	key, _ := kf(r)
	fmt.Println(key) // the secret is hashed

	_, err = kf(httptest.NewRequest("GET", "/", nil))
	fmt.Println(err)
	// Output:
	// key:Ruj6_9MOleqs5na2g9V4xh
	// keyfuncs: no key: header X-Api-Key is missing or empty
}

type ctxUserKey struct{}

func ExampleUser() {
	// The app's authentication middleware puts the user id in the context.
	userID := func(ctx context.Context) string {
		id, _ := ctx.Value(ctxUserKey{}).(string)
		return id
	}
	kf, err := keyfuncs.User(userID)
	if err != nil {
		panic(err) // a nil function
	}

	r := httptest.NewRequest("GET", "/", nil)
	key, _ := kf(r.WithContext(context.WithValue(r.Context(), ctxUserKey{}, "42")))
	fmt.Println(key)

	_, err = kf(r)
	fmt.Println(err)
	// Output:
	// user:42
	// keyfuncs: no key: no authenticated user in the request context
}

func ExamplePattern() {
	// limit stands in for a limiter's Handler.
	limit := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := keyfuncs.Pattern(r)
			fmt.Printf("key %q, error %v\n", key, err)
			next.ServeHTTP(w, r)
		})
	}
	item := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})

	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", limit(item)) // inside the mux: the pattern is set
	mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/items/7", nil))

	// Around the mux, the request is not routed yet: the outer limit has no
	// key; the inner one, reached through the mux, has.
	limit(mux).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/items/7", nil))
	// Output:
	// key "route:GET /items/{id}", error <nil>
	// key "", error keyfuncs: invalid configuration: no key: no ServeMux pattern (Request.Pattern is empty): wrap a handler registered in the mux, not the mux
	// key "route:GET /items/{id}", error <nil>
}

func ExampleJoin() {
	userID := func(ctx context.Context) string {
		id, _ := ctx.Value(ctxUserKey{}).(string)
		return id
	}
	user, err := keyfuncs.User(userID)
	if err != nil {
		panic(err)
	}
	// Per user per route.
	kf, err := keyfuncs.Join(user, keyfuncs.Pattern)
	if err != nil {
		panic(err) // no parts, or a nil one
	}

	r := httptest.NewRequest("POST", "/orders", nil)
	r = r.WithContext(context.WithValue(r.Context(), ctxUserKey{}, "42"))
	r.Pattern = "POST /orders" // as http.ServeMux sets it
	key, _ := kf(r)
	fmt.Println(key)

	r.Pattern = ""
	_, err = kf(r)
	fmt.Println(err)
	// Output:
	// user:42|route:POST /orders
	// keyfuncs: Join part 1: keyfuncs: invalid configuration: no key: no ServeMux pattern (Request.Pattern is empty): wrap a handler registered in the mux, not the mux
}

func ExampleClientIP() {
	// Behind a load balancer in 10.0.0.0/8 that appends to X-Forwarded-For.
	kf, err := keyfuncs.ClientIP(
		keyfuncs.TrustProxies("10.0.0.0/8"),
		keyfuncs.FromXForwardedFor(),
	)
	if err != nil {
		panic(err)
	}
	for _, c := range []struct{ remoteAddr, xff string }{
		{"10.0.0.1:443", "198.51.100.1"},
		{"10.0.0.1:443", "6.6.6.6, 198.51.100.1"},      // forged leftmost entry: ignored
		{"10.0.0.1:443", "2001:db8:1:2::99, 10.0.0.7"}, // trusted hops skipped; IPv6 by /64
		{"10.0.0.1:443", "::ffff:198.51.100.1"},        // IPv4-mapped: the IPv4 key
		{"10.0.0.1:443", "198.51.100.1, garbage"},      // malformed: the peer
		{"203.0.113.7:5555", "198.51.100.1"},           // untrusted peer: header ignored
		{"10.0.0.1:443", ""},                           // no header: the peer
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = c.remoteAddr
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		key, _ := kf(r)
		fmt.Println(key)
	}

	_, err = keyfuncs.ClientIP(keyfuncs.TrustProxies("10.0.0.0/33"), keyfuncs.FromXForwardedFor())
	fmt.Println(err)
	// Output:
	// ip:198.51.100.1
	// ip:198.51.100.1
	// ip:2001:db8:1:2::/64
	// ip:198.51.100.1
	// ip:10.0.0.1
	// ip:203.0.113.7
	// ip:10.0.0.1
	// keyfuncs: invalid configuration: TrustProxies "10.0.0.0/33" is not an IP network (CIDR) or address
}

func ExampleFromForwarded() {
	kf, err := keyfuncs.ClientIP(
		keyfuncs.TrustProxies("10.0.0.0/8", "2001:db8:ffff::/48"),
		keyfuncs.FromForwarded(),
		keyfuncs.IPv6Prefix(56),
	)
	if err != nil {
		panic(err)
	}
	for _, forwarded := range []string{
		`for=198.51.100.1;proto=https`,
		`for="[2001:db8:1:2ff::1]:4711", for=10.0.0.2;by="[2001:db8:ffff::1]"`,
		`for=unknown`,
		`for=_hidden, for=198.51.100.1`,
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "10.0.0.1:443"
		r.Header.Set("Forwarded", forwarded)
		key, _ := kf(r)
		fmt.Println(key)
	}
	// Output:
	// ip:198.51.100.1
	// ip:2001:db8:1:200::/56
	// ip:10.0.0.1
	// ip:198.51.100.1
}

func ExampleTrustedHops() {
	// client → CDN → load balancer → server: the load balancer is the peer,
	// it appended the CDN's address (hop 1), the CDN appended the client's
	// (hop 2). Only the proxies can reach the server, so any peer is one.
	kf, err := keyfuncs.ClientIP(
		keyfuncs.TrustProxies("0.0.0.0/0", "::/0"),
		keyfuncs.TrustedHops(2),
	)
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:443"
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 198.51.100.1, 203.0.113.50")
	key, _ := kf(r)
	fmt.Println(key)
	// Output:
	// ip:198.51.100.1
}

func ExampleClientIPMiddleware() {
	opts := []keyfuncs.IPOption{
		keyfuncs.TrustProxies("10.0.0.0/8"),
		keyfuncs.FromHeader("X-Real-IP"),
	}
	resolve, err := keyfuncs.ClientIPMiddleware(opts...)
	if err != nil {
		panic(err)
	}
	kf, err := keyfuncs.ClientIP(opts...) // reuses what resolve stored
	if err != nil {
		panic(err)
	}
	h := resolve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr, _ := keyfuncs.ClientAddr(r.Context())
		key, _ := kf(r)
		fmt.Println(addr, key, r.RemoteAddr)
	}))

	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.1:443"
	r.Header.Set("X-Real-IP", "2001:db8:1:2::99")
	h.ServeHTTP(httptest.NewRecorder(), r)
	// Output:
	// 2001:db8:1:2::99 ip:2001:db8:1:2::/64 10.0.0.1:443
}

type ctxClientIPKey struct{}

func ExampleClientIPFromContext() {
	// getClientIP stands in for chi's middleware.GetClientIP (chi v5.3+),
	// which reads what middleware.ClientIPFromXFF and the like stored.
	getClientIP := func(ctx context.Context) string {
		ip, _ := ctx.Value(ctxClientIPKey{}).(string)
		return ip
	}
	kf, err := keyfuncs.ClientIPFromContext(getClientIP, keyfuncs.IPv6Prefix(48))
	if err != nil {
		panic(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	for _, ip := range []string{"198.51.100.1", "::ffff:198.51.100.1", "2001:db8:1:2::99", ""} {
		key, err := kf(r.WithContext(context.WithValue(r.Context(), ctxClientIPKey{}, ip)))
		fmt.Printf("%q %v\n", key, err)
	}
	// Output:
	// "ip:198.51.100.1" <nil>
	// "ip:198.51.100.1" <nil>
	// "ip:2001:db8:1::/48" <nil>
	// "" keyfuncs: no key: no client IP in the request context
}
