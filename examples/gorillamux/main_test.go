package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/store"
)

// newMiniredisRouter returns the router on a miniredis whose clock stands
// still, so that every header value is exact.
func newMiniredisRouter(t *testing.T) (http.Handler, *miniredis.Miniredis) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	// The go-redis default timeouts and no decision budget: on a loaded
	// test machine the production timeouts (50ms, 100ms) could expire
	// while miniredis answers, and a request be decided by the failure
	// policy. ContextTimeoutEnabled as the store requires; patientStore's
	// contexts have no deadline.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	h, err := newRouter(patientStore{store.NewRedis(rdb)})
	if err != nil {
		t.Fatal(err)
	}
	return h, mr
}

// patientStore waits for the store whatever the caller's deadline.
type patientStore struct{ store.Store }

func (p patientStore) Take(ctx context.Context, key string, limit store.Limit, cost int) (store.Result, error) {
	return p.Store.Take(context.WithoutCancel(ctx), key, limit, cost)
}

// send serves one GET from the client at ip, with the API key if not "".
func send(h http.Handler, target, ip, apiKey string) *http.Response {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.RemoteAddr = ip + ":50000"
	if apiKey != "" {
		req.Header.Set("X-API-Key", apiKey)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func wantStatus(t *testing.T, what string, resp *http.Response, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s: got status %d, want %d", what, resp.StatusCode, want)
	}
}

func wantHeader(t *testing.T, what string, resp *http.Response, name, want string) {
	t.Helper()
	if got := resp.Header.Get(name); got != want {
		t.Errorf("%s: got %s %q, want %q", what, name, got, want)
	}
}

func TestRouterLimit(t *testing.T) {
	h, _ := newMiniredisRouter(t)
	for i := 1; i <= 100; i++ {
		what := fmt.Sprintf("GET / %d", i)
		resp := send(h, "/", "192.0.2.1", "")
		wantStatus(t, what, resp, http.StatusOK)
		wantHeader(t, what, resp, "RateLimit", fmt.Sprintf(`"ip";r=%d;t=1`, 100-i))
	}
	resp := send(h, "/", "192.0.2.1", "")
	wantStatus(t, "GET / 101", resp, http.StatusTooManyRequests)
	wantHeader(t, "GET / 101", resp, "Retry-After", "1")

	// The router's limit covers the subrouter too.
	resp = send(h, "/api/reports/7", "192.0.2.1", "k1")
	wantStatus(t, "GET /api/reports/7", resp, http.StatusTooManyRequests)
	wantHeader(t, "GET /api/reports/7", resp, "RateLimit", `"ip";r=0;t=1`)

	resp = send(h, "/", "192.0.2.2", "")
	wantStatus(t, "GET / from another IP", resp, http.StatusOK)

	// No route, no middleware: gorilla/mux answers 404 itself.
	for _, target := range []string{"/nope", "/api/nope"} {
		resp = send(h, target, "192.0.2.1", "k1")
		wantStatus(t, "GET "+target, resp, http.StatusNotFound)
		wantHeader(t, "GET "+target, resp, "RateLimit", "")
	}
}

func TestSubrouterLimit(t *testing.T) {
	h, _ := newMiniredisRouter(t)
	for i := 1; i <= 10; i++ {
		what := fmt.Sprintf("key k1, request %d", i)
		resp := send(h, "/api/reports/7", "192.0.2.1", "k1")
		wantStatus(t, what, resp, http.StatusOK)
		wantHeader(t, what, resp, "RateLimit-Policy", `"ip";q=100;w=60, "apikey";q=10;w=60`)
		wantHeader(t, what, resp, "RateLimit", fmt.Sprintf(`"ip";r=%d;t=1, "apikey";r=%d;t=6`, 100-i, 10-i))
	}
	resp := send(h, "/api/reports/8", "192.0.2.1", "k1")
	wantStatus(t, "key k1, request 11", resp, http.StatusTooManyRequests)
	wantHeader(t, "key k1, request 11", resp, "Retry-After", "6")

	// The same key from another IP is the same bucket.
	resp = send(h, "/api/reports/7", "198.51.100.7", "k1")
	wantStatus(t, "key k1 from another IP", resp, http.StatusTooManyRequests)

	// Another key, from the same IP, has its own bucket.
	resp = send(h, "/api/reports/7", "192.0.2.1", "k2")
	wantStatus(t, "key k2", resp, http.StatusOK)
	wantHeader(t, "key k2", resp, "RateLimit", `"ip";r=88;t=1, "apikey";r=9;t=6`)

	// No key: 401 from the key-error handler, never a shared bucket.
	for i := 1; i <= 15; i++ {
		what := fmt.Sprintf("no key, request %d", i)
		resp = send(h, "/api/reports/7", "203.0.113.9", "")
		wantStatus(t, what, resp, http.StatusUnauthorized)
		wantHeader(t, what, resp, "WWW-Authenticate", `APIKey header="X-API-Key"`)
		// The per-IP limiter ran first and counted the request.
		wantHeader(t, what, resp, "RateLimit", fmt.Sprintf(`"ip";r=%d;t=1`, 100-i))
	}

	// The router's other routes do not pass the subrouter's limiter.
	resp = send(h, "/", "192.0.2.1", "k1")
	wantStatus(t, "GET /", resp, http.StatusOK)
	wantHeader(t, "GET /", resp, "RateLimit", `"ip";r=87;t=1`)
}

func TestRealRedis(t *testing.T) {
	srv := redistest.Server(t)
	rdb := newRedisClient(srv.Addr)
	t.Cleanup(func() { rdb.Close() })
	// A prefix of its own: REDIS_ADDR may point at a server other tests share.
	prefix := fmt.Sprintf("tollgate-example-gorillamux-%d:", time.Now().UnixNano())
	h, err := newRouter(store.NewRedis(rdb, store.WithKeyPrefix(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)

	get := func(what, apiKey string, want int) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, ts.URL+"/api/reports/1", nil)
		if apiKey != "" {
			req.Header.Set("X-API-Key", apiKey)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wantStatus(t, what, resp, want)
		return resp
	}
	for i := 1; i <= 10; i++ {
		resp := get(fmt.Sprintf("request %d", i), "k1", http.StatusOK)
		wantHeader(t, "request", resp, "RateLimit-Policy", `"ip";q=100;w=60, "apikey";q=10;w=60`)
	}
	resp := get("request 11", "k1", http.StatusTooManyRequests)
	if got := resp.Header.Get("Retry-After"); got != "6" && got != "5" {
		t.Errorf("request 11: Retry-After %q, want 5 or 6 (a token per 6s)", got)
	}
	get("another key", "k2", http.StatusOK)
	get("no key", "", http.StatusUnauthorized)
}
