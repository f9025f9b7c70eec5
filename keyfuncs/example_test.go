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
	kf := keyfuncs.Header("X-Api-Key")

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Api-Key", "sk_live_123")
	key, _ := kf(r)
	fmt.Println(key) // the secret is hashed

	_, err := kf(httptest.NewRequest("GET", "/", nil))
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
	kf := keyfuncs.User(userID)

	r := httptest.NewRequest("GET", "/", nil)
	key, _ := kf(r.WithContext(context.WithValue(r.Context(), ctxUserKey{}, "42")))
	fmt.Println(key)

	_, err := kf(r)
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
	// key "", error keyfuncs: no key: no ServeMux pattern (Request.Pattern is empty)
	// key "route:GET /items/{id}", error <nil>
}

func ExampleJoin() {
	userID := func(ctx context.Context) string {
		id, _ := ctx.Value(ctxUserKey{}).(string)
		return id
	}
	// Per user per route.
	kf := keyfuncs.Join(keyfuncs.User(userID), keyfuncs.Pattern)

	r := httptest.NewRequest("POST", "/orders", nil)
	r = r.WithContext(context.WithValue(r.Context(), ctxUserKey{}, "42"))
	r.Pattern = "POST /orders" // as http.ServeMux sets it
	key, _ := kf(r)
	fmt.Println(key)

	r.Pattern = ""
	_, err := kf(r)
	fmt.Println(err)
	// Output:
	// user:42|route:POST /orders
	// keyfuncs: Join part 1: keyfuncs: no key: no ServeMux pattern (Request.Pattern is empty)
}
