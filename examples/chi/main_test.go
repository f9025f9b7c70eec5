package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// send serves one request from the client at ip; header holds name, value
// pairs.
func send(t *testing.T, h http.Handler, method, target, ip string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = ip + ":50000"
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
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

func TestLogin(t *testing.T) {
	h, _ := newMiniredisRouter(t)
	for i := 1; i <= 5; i++ {
		what := fmt.Sprintf("login %d", i)
		resp := send(t, h, http.MethodPost, "/login", "192.0.2.1")
		wantStatus(t, what, resp, http.StatusOK)
		wantHeader(t, what, resp, "RateLimit-Policy", `"login";q=5;w=60`)
		// One token every 12s: the next one is 12s away once any is taken.
		wantHeader(t, what, resp, "RateLimit", fmt.Sprintf(`"login";r=%d;t=12`, 5-i))
		wantHeader(t, what, resp, "Retry-After", "")
	}
	resp := send(t, h, http.MethodPost, "/login", "192.0.2.1")
	wantStatus(t, "login 6", resp, http.StatusTooManyRequests)
	wantHeader(t, "login 6", resp, "RateLimit", `"login";r=0;t=12`)
	wantHeader(t, "login 6", resp, "Retry-After", "12")

	// Another client has its own bucket.
	resp = send(t, h, http.MethodPost, "/login", "192.0.2.2")
	wantStatus(t, "login from another IP", resp, http.StatusOK)
	wantHeader(t, "login from another IP", resp, "RateLimit", `"login";r=4;t=12`)
}

func TestAPI(t *testing.T) {
	h, _ := newMiniredisRouter(t)
	// Every route of the group draws on the one "api" bucket of the IP.
	for i := 1; i <= 100; i++ {
		target := "/api/items"
		if i%2 == 0 {
			target = "/api/items/" + strconv.Itoa(i)
		}
		resp := send(t, h, http.MethodGet, target, "192.0.2.1")
		wantStatus(t, "GET "+target, resp, http.StatusOK)
		if i == 1 {
			wantHeader(t, "GET "+target, resp, "RateLimit-Policy", `"api";q=100;w=60`)
			wantHeader(t, "GET "+target, resp, "RateLimit-Limit", "100")
			wantHeader(t, "GET "+target, resp, "RateLimit-Remaining", "99")
		}
	}
	resp := send(t, h, http.MethodGet, "/api/items/1", "192.0.2.1")
	wantStatus(t, "request 101", resp, http.StatusTooManyRequests)
	wantHeader(t, "request 101", resp, "Retry-After", "1") // one token per 600ms
	wantHeader(t, "request 101", resp, "RateLimit", `"api";r=0;t=1`)

	// The login bucket of the same IP is another one.
	resp = send(t, h, http.MethodPost, "/login", "192.0.2.1")
	wantStatus(t, "login after the API burst", resp, http.StatusOK)
	wantHeader(t, "login after the API burst", resp, "RateLimit", `"login";r=4;t=12`)

	// The health check passes no limiter.
	resp = send(t, h, http.MethodGet, "/healthz", "192.0.2.1")
	wantStatus(t, "GET /healthz", resp, http.StatusOK)
	wantHeader(t, "GET /healthz", resp, "RateLimit", "")
}

func TestPerUser(t *testing.T) {
	h, _ := newMiniredisRouter(t)
	alice := []string{"Authorization", "Bearer alice"}
	for i := 1; i <= 60; i++ {
		target := "/me"
		if i%2 == 0 {
			target = "/me/orders"
		}
		resp := send(t, h, http.MethodGet, target, "192.0.2.1", alice...)
		wantStatus(t, fmt.Sprintf("alice %d: GET %s", i, target), resp, http.StatusOK)
	}
	resp := send(t, h, http.MethodGet, "/me", "192.0.2.1", alice...)
	wantStatus(t, "alice 61", resp, http.StatusTooManyRequests)
	wantHeader(t, "alice 61", resp, "RateLimit", `"user";r=0;t=1`)
	wantHeader(t, "alice 61", resp, "Retry-After", "1")

	// Alice from another IP is still alice.
	resp = send(t, h, http.MethodGet, "/me", "198.51.100.7", alice...)
	wantStatus(t, "alice from another IP", resp, http.StatusTooManyRequests)

	// Bob, from alice's IP, has his own bucket.
	resp = send(t, h, http.MethodGet, "/me", "192.0.2.1", "Authorization", "Bearer bob")
	wantStatus(t, "bob", resp, http.StatusOK)
	wantHeader(t, "bob", resp, "RateLimit-Policy", `"user";q=60;w=60`)
	wantHeader(t, "bob", resp, "RateLimit", `"user";r=59;t=1`)

	// No user: the auth middleware answers 401, every time, and the limiter
	// never sees the request (no shared bucket of anonymous requests).
	for i := 1; i <= 70; i++ {
		for _, header := range [][]string{nil, {"Authorization", "Bearer "}, {"Authorization", "Basic YTpi"}} {
			what := fmt.Sprintf("anonymous %d %q", i, header)
			resp := send(t, h, http.MethodGet, "/me", "192.0.2.1", header...)
			wantStatus(t, what, resp, http.StatusUnauthorized)
			wantHeader(t, what, resp, "WWW-Authenticate", "Bearer")
			wantHeader(t, what, resp, "RateLimit", "")
		}
	}
}

// TestRedisDown checks the failure policies: with Redis gone, login fails
// closed and the API and user groups fall back to their local limits.
func TestRedisDown(t *testing.T) {
	// The production client and budget: what happens when Redis is gone.
	mr := miniredis.RunT(t)
	rdb := newRedisClient(mr.Addr())
	t.Cleanup(func() { rdb.Close() })
	h, err := newRouter(store.NewRedis(rdb))
	if err != nil {
		t.Fatal(err)
	}
	mr.Close()

	resp := send(t, h, http.MethodPost, "/login", "192.0.2.1")
	wantStatus(t, "login", resp, http.StatusServiceUnavailable)
	wantHeader(t, "login", resp, "Retry-After", "1")
	wantHeader(t, "login", resp, "RateLimit", "")

	resp = send(t, h, http.MethodGet, "/api/items", "192.0.2.1")
	wantStatus(t, "GET /api/items", resp, http.StatusOK)
	wantHeader(t, "GET /api/items", resp, "RateLimit", `"api";r=99;t=1`) // FailLocal: limited in process

	resp = send(t, h, http.MethodGet, "/me", "192.0.2.1", "Authorization", "Bearer alice")
	wantStatus(t, "GET /me", resp, http.StatusOK)
}

// TestRealRedis runs the router over HTTP against a real redis-server,
// then pauses the server (SIGSTOP): login must fail closed, and the API
// fall back to its local limit, within the limiter's budget rather than
// go-redis's defaults.
func TestRealRedis(t *testing.T) {
	srv := redistest.Server(t)
	rdb := newRedisClient(srv.Addr)
	t.Cleanup(func() { rdb.Close() })
	// A prefix of its own: REDIS_ADDR may point at a server other tests share.
	prefix := fmt.Sprintf("tollgate-example-chi-%d:", time.Now().UnixNano())
	h, err := newRouter(store.NewRedis(rdb, store.WithKeyPrefix(prefix)))
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)

	post := func(what string, want int) *http.Response {
		t.Helper()
		resp, err := ts.Client().Post(ts.URL+"/login", "text/plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wantStatus(t, what, resp, want)
		return resp
	}
	for i := 1; i <= 5; i++ {
		resp := post(fmt.Sprintf("login %d", i), http.StatusOK)
		wantHeader(t, "login", resp, "RateLimit-Remaining", strconv.Itoa(5-i))
	}
	resp := post("login 6", http.StatusTooManyRequests)
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 11 || s > 12 {
		t.Errorf("login 6: Retry-After %q, want 11 or 12 (one token per 12s)", resp.Header.Get("Retry-After"))
	}

	t.Run("paused", func(t *testing.T) {
		srv.Pause() // skips this subtest on an external server
		defer srv.Resume()

		start := time.Now()
		resp := post("login, Redis paused", http.StatusServiceUnavailable)
		wantHeader(t, "login, Redis paused", resp, "Retry-After", "1")

		resp, err := ts.Client().Get(ts.URL + "/api/items")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		wantStatus(t, "GET /api/items, Redis paused", resp, http.StatusOK)
		wantHeader(t, "GET /api/items, Redis paused", resp, "RateLimit", `"api";r=99;t=1`) // FailLocal
		// Each decision gives up after the 100ms budget; allow for a slow
		// machine, but not for go-redis's 3s default read timeout.
		if d := time.Since(start); d > time.Second {
			t.Errorf("two requests with Redis paused took %v, want well under 1s", d)
		}
	})
}
