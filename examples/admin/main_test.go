package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// caller returns a function serving one request from remote through a handler.
func caller(remote string) func(h http.Handler, method, path string) *httptest.ResponseRecorder {
	return func(h http.Handler, method, path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(method, path, nil)
		r.RemoteAddr = remote
		h.ServeHTTP(w, r)
		return w
	}
}

// The operator endpoints on both stores: read a client's bucket, block the
// client (its requests get 429), reset it (they pass again).
func TestAdmin(t *testing.T) {
	m := store.NewMemory()
	t.Cleanup(func() { m.Close() })
	for name, st := range map[string]Store{
		"memory": m,
		"redis":  store.NewRedis(redistest.Server(t).Client(t), store.WithKeyPrefix(t.Name()+":")),
	} {
		t.Run(name, func(t *testing.T) {
			lim, err := middleware.New(st, store.PerMinute(30), middleware.WithName("api"), middleware.WithDenyCache(100))
			if err != nil {
				t.Fatal(err)
			}
			api := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
			adm := adminHandler(st, lim)
			call := caller("192.0.2.7:1234")
			for range 3 {
				call(api, "GET", "/")
			}
			var got struct{ Remaining int }
			if w := call(adm, "GET", "/buckets/ip:192.0.2.7"); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &got) != nil || got.Remaining != 27 {
				t.Errorf("GET: %d %s; want 27 remaining", w.Code, w.Body)
			}
			if w := call(adm, "POST", "/buckets/ip:192.0.2.7?block=10m"); w.Code != http.StatusNoContent {
				t.Errorf("POST block: %d %s", w.Code, w.Body)
			}
			for range 2 { // the second from the deny cache
				if w := call(api, "GET", "/"); w.Code != http.StatusTooManyRequests {
					t.Errorf("a blocked client: %d, want 429", w.Code)
				}
			}
			if w := call(adm, "POST", "/buckets/ip:192.0.2.7?block=soon"); w.Code != http.StatusBadRequest {
				t.Errorf("POST block=soon: %d, want 400", w.Code)
			}
			if w := call(adm, "DELETE", "/buckets/ip:192.0.2.7"); w.Code != http.StatusNoContent {
				t.Errorf("DELETE: %d %s", w.Code, w.Body)
			}
			if w := call(api, "GET", "/"); w.Code != http.StatusOK {
				t.Errorf("after the reset: %d, want 200 (the deny cache forgot the client)", w.Code)
			}
			if w := call(adm, "GET", "/buckets/ip:2001:db8::/64"); w.Code != 200 {
				t.Errorf("GET of an IPv6 subject, with its slash: %d %s", w.Code, w.Body)
			}
		})
	}
}

// A daily quota through the same endpoints: read its count, reset it (a
// block is a token bucket's: 400).
func TestAdminQuota(t *testing.T) {
	m := store.NewMemory()
	t.Cleanup(func() { m.Close() })
	for name, st := range map[string]Store{
		"memory": m,
		"redis":  store.NewRedis(redistest.Server(t).Client(t), store.WithKeyPrefix(t.Name()+":")),
	} {
		t.Run(name, func(t *testing.T) {
			lim, err := middleware.New(st, store.PerDayIn(5, nil), middleware.WithName("daily"))
			if err != nil {
				t.Fatal(err)
			}
			api := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
			adm := adminHandler(st, lim)
			call := caller("192.0.2.8:1234")
			for range 5 {
				call(api, "GET", "/")
			}
			if w := call(api, "GET", "/"); w.Code != http.StatusTooManyRequests {
				t.Fatalf("past the quota: %d, want 429", w.Code)
			}
			var got struct {
				Remaining int
				Allowed   bool
			}
			if w := call(adm, "GET", "/buckets/ip:192.0.2.8"); w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &got) != nil || got.Remaining != 0 || got.Allowed {
				t.Errorf("GET: %d %s; want 0 remaining, not allowed", w.Code, w.Body)
			}
			if w := call(adm, "POST", "/buckets/ip:192.0.2.8?block=10m"); w.Code != http.StatusBadRequest {
				t.Errorf("POST block of a quota: %d %s; want 400", w.Code, w.Body)
			}
			if w := call(adm, "DELETE", "/buckets/ip:192.0.2.8"); w.Code != http.StatusNoContent {
				t.Errorf("DELETE: %d %s", w.Code, w.Body)
			}
			if w := call(api, "GET", "/"); w.Code != http.StatusOK {
				t.Errorf("after the reset: %d, want 200: the quota's count is gone", w.Code)
			}
		})
	}
}
