package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/store"
)

// newMiniredisHandler returns the handler on a miniredis whose clock stands
// still, so that every header value is exact.
func newMiniredisHandler(t *testing.T) (http.Handler, *miniredis.Miniredis) {
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
	h, err := newHandler(patientStore{store.NewRedis(rdb)})
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

// send serves one request from the client at ip.
func send(h http.Handler, method, target, ip string) *http.Response {
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = ip + ":50000"
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

func TestPerRoute(t *testing.T) {
	h, mr := newMiniredisHandler(t)

	// Every GET /items/{id} draws on one bucket, whatever the id.
	for i := 1; i <= 20; i++ {
		what := fmt.Sprintf("GET /items/%d", i)
		resp := send(h, http.MethodGet, fmt.Sprintf("/items/%d", i), "192.0.2.1")
		wantStatus(t, what, resp, http.StatusOK)
		// Both limiters report, one list item each; 20/min is a token per 3s.
		wantHeader(t, what, resp, "RateLimit-Policy", `"ip";q=100;w=60, "route";q=20;w=60`)
		wantHeader(t, what, resp, "RateLimit", fmt.Sprintf(`"ip";r=%d;t=1, "route";r=%d;t=3`, 100-i, 20-i))
	}
	resp := send(h, http.MethodGet, "/items/21", "192.0.2.1")
	wantStatus(t, "GET /items/21", resp, http.StatusTooManyRequests)
	wantHeader(t, "GET /items/21", resp, "RateLimit", `"ip";r=79;t=1, "route";r=0;t=3`)
	wantHeader(t, "GET /items/21", resp, "Retry-After", "3")
	// The single-value fields report the tightest limit.
	wantHeader(t, "GET /items/21", resp, "RateLimit-Limit", "20")
	wantHeader(t, "GET /items/21", resp, "RateLimit-Remaining", "0")

	// The route budget is shared by all clients.
	resp = send(h, http.MethodGet, "/items/1", "198.51.100.7")
	wantStatus(t, "GET /items/1 from another IP", resp, http.StatusTooManyRequests)
	wantHeader(t, "GET /items/1 from another IP", resp, "RateLimit", `"ip";r=99;t=1, "route";r=0;t=3`)

	// Another pattern has a bucket of its own.
	resp = send(h, http.MethodPost, "/items", "192.0.2.1")
	wantStatus(t, "POST /items", resp, http.StatusCreated)
	wantHeader(t, "POST /items", resp, "RateLimit", `"ip";r=78;t=1, "route";r=19;t=3`)

	// A route without the per-route limiter is limited per IP only.
	resp = send(h, http.MethodGet, "/healthz", "192.0.2.1")
	wantStatus(t, "GET /healthz", resp, http.StatusOK)
	wantHeader(t, "GET /healthz", resp, "RateLimit", `"ip";r=77;t=1`)

	keys := mr.Keys()
	for _, want := range []string{
		"tollgate:{route:route:GET /items/{id}}",
		"tollgate:route:route:POST /items",
		"tollgate:ip:ip:192.0.2.1",
		"tollgate:ip:ip:198.51.100.7",
	} {
		if !slices.Contains(keys, want) {
			t.Errorf("Redis keys %q: missing %q", keys, want)
		}
	}
	if len(keys) != 4 {
		t.Errorf("Redis keys %q: want 4", keys)
	}
}

func TestPerIP(t *testing.T) {
	h, _ := newMiniredisHandler(t)
	for i := 1; i <= 100; i++ {
		resp := send(h, http.MethodGet, "/healthz", "192.0.2.1")
		wantStatus(t, fmt.Sprintf("GET /healthz %d", i), resp, http.StatusOK)
	}
	// The per-IP limiter refuses before the mux routes the request.
	resp := send(h, http.MethodPost, "/items", "192.0.2.1")
	wantStatus(t, "POST /items, IP exhausted", resp, http.StatusTooManyRequests)
	wantHeader(t, "POST /items, IP exhausted", resp, "RateLimit", `"ip";r=0;t=1`)
	wantHeader(t, "POST /items, IP exhausted", resp, "Retry-After", "1")

	resp = send(h, http.MethodPost, "/items", "192.0.2.2")
	wantStatus(t, "POST /items from another IP", resp, http.StatusCreated)
}

func TestRealRedis(t *testing.T) {
	srv := redistest.Server(t)
	rdb := newRedisClient(srv.Addr)
	t.Cleanup(func() { rdb.Close() })
	// A prefix of its own: REDIS_ADDR may point at a server other tests share.
	prefix := fmt.Sprintf("tollgate-example-nethttp-%d:", time.Now().UnixNano())
	h, err := newHandler(store.NewRedis(rdb, store.WithKeyPrefix(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)

	do := func(method, path string, want int) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, ts.URL+path, nil)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wantStatus(t, method+" "+path, resp, want)
		return resp
	}
	for i := 1; i <= 20; i++ {
		resp := do(http.MethodGet, fmt.Sprintf("/items/%d", i), http.StatusOK)
		wantHeader(t, "GET /items", resp, "RateLimit-Policy", `"ip";q=100;w=60, "route";q=20;w=60`)
	}
	resp := do(http.MethodGet, "/items/21", http.StatusTooManyRequests)
	if got := resp.Header.Get("Retry-After"); got != "3" && got != "2" {
		t.Errorf("GET /items/21: Retry-After %q, want 2 or 3 (a token per 3s)", got)
	}
	do(http.MethodPost, "/items", http.StatusCreated)

	keys, err := rdb.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	want := []string{
		prefix + "ip:ip:127.0.0.1",
		prefix + "route:route:POST /items",
		prefix + "{route:route:GET /items/{id}}", // the subject's brace: wrapped
	}
	if !slices.Equal(keys, want) {
		t.Errorf("Redis keys: got %q, want %q", keys, want)
	}
}
