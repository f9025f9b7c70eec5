package client_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/client"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// counting is a base transport that counts what the server answered.
type counting struct {
	sent, refused atomic.Int64
}

func (c *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(req)
	c.sent.Add(1)
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		c.refused.Add(1)
	}
	return resp, err
}

// 50 requests from one client to a tollgate server at 5/s: every one ends
// in a 200. Without pacing each refusal is retried once, when Retry-After
// says; with pacing the client waits for the tokens first and is never
// refused.
func TestAgainstTollgate(t *testing.T) {
	m := store.NewMemory()
	t.Cleanup(func() { m.Close() })
	for _, pace := range []bool{false, true} {
		name := map[bool]string{false: "retry", true: "pace"}[pace]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			key, err := keyfuncs.Static(name)
			if err != nil {
				t.Fatal(err)
			}
			l, err := middleware.New(m, store.PerSecond(5), middleware.WithName(name), middleware.WithKeyFunc(key))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })))
			t.Cleanup(srv.Close)
			base := &counting{}
			c := &http.Client{Transport: &client.Transport{Base: base, Pace: pace, MaxWait: 5 * time.Second}}
			start := time.Now()
			for i := range 50 {
				resp, err := c.Get(srv.URL)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d: %d after %d sends", i, resp.StatusCode, base.sent.Load())
				}
			}
			elapsed := time.Since(start)
			t.Logf("%s: 50 requests at 5/s in %v: %d sends, %d refused", name, elapsed.Round(time.Millisecond), base.sent.Load(), base.refused.Load())
			// A refusal happens at most once per exhausted burst: one a second.
			if most := int64(elapsed/time.Second) + 1; base.refused.Load() > most || (pace && base.refused.Load() > 0) {
				t.Errorf("%d refusals in %v; want at most %d, none when pacing", base.refused.Load(), elapsed, most)
			}
			if base.sent.Load() != 50+base.refused.Load() {
				t.Errorf("%d sends for 50 requests and %d refusals: a retry too many", base.sent.Load(), base.refused.Load())
			}
		})
	}
}

// plain answers the first refusals requests with status and headers, then 200.
func plain(t *testing.T, refusals int, status int, header map[string]string) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if n.Add(1) <= int64(refusals) {
			for k, v := range header {
				w.Header().Set(k, v)
			}
			w.WriteHeader(status)
			return
		}
		w.Write(body) // echoes the body: a replayed body arrives whole
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestRetryAfterSecondsAndDate(t *testing.T) {
	for _, ra := range []string{"0", time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)} {
		srv, n := plain(t, 2, http.StatusTooManyRequests, map[string]string{"Retry-After": ra})
		c := &http.Client{Transport: &client.Transport{}}
		req, _ := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("payload"))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || n.Load() != 3 || string(body) != "payload" {
			t.Errorf("Retry-After %q: %d %q after %d sends; want 200, the body replayed, 3 sends", ra, resp.StatusCode, body, n.Load())
		}
	}
}

func TestRateLimitFieldAlone(t *testing.T) {
	srv, n := plain(t, 1, http.StatusServiceUnavailable, map[string]string{"RateLimit": `"a, b";r=3;t=9, "api";r=0;t=0`})
	resp, err := (&http.Client{Transport: &client.Transport{}}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || n.Load() != 2 {
		t.Errorf("a 503 with an exhausted RateLimit item: %d after %d sends; want 200 after 2", resp.StatusCode, n.Load())
	}
}

// What is not retried: a deadline before the Retry-After (returned at
// once), a wait past MaxWait, the attempts cap, a POST, a spent body, a
// refusal that says nothing about when.
func TestNotRetried(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		header  map[string]string
		tr      *client.Transport
		req     func(url string) *http.Request
		timeout time.Duration
		sends   int64
	}{
		{"deadline first", 429, map[string]string{"Retry-After": "5"}, &client.Transport{}, get, time.Second, 1},
		{"past MaxWait", 429, map[string]string{"Retry-After": "2"}, &client.Transport{MaxWait: time.Second}, get, 0, 1},
		{"attempts cap", 429, map[string]string{"Retry-After": "0"}, &client.Transport{MaxAttempts: 4}, get, 0, 4},
		{"POST", 429, map[string]string{"Retry-After": "0"}, &client.Transport{}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
			return r
		}, 0, 1},
		{"POST, Retryable", 429, map[string]string{"Retry-After": "0"}, &client.Transport{Retryable: func(*http.Request) bool { return true }},
			func(url string) *http.Request {
				r, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte("x")))
				return r
			}, 0, 3},
		{"spent body", 429, map[string]string{"Retry-After": "0"}, &client.Transport{}, func(url string) *http.Request {
			r, _ := http.NewRequest(http.MethodPut, url, io.NopCloser(strings.NewReader("x")))
			return r
		}, 0, 1},
		{"no when", 503, nil, &client.Transport{}, get, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, n := plain(t, 100, tc.status, tc.header)
			req := tc.req(srv.URL)
			if tc.timeout > 0 {
				ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
				defer cancel()
				req = req.WithContext(ctx)
			}
			start := time.Now()
			resp, err := (&http.Client{Transport: tc.tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			took := time.Since(start)
			if resp.StatusCode != tc.status || n.Load() != tc.sends {
				t.Errorf("%d after %d sends; want %d after %d", resp.StatusCode, n.Load(), tc.status, tc.sends)
			}
			if took > 500*time.Millisecond {
				t.Errorf("returned after %v: it slept", took)
			}
		})
	}
}

func get(url string) *http.Request {
	r, _ := http.NewRequest(http.MethodGet, url, nil)
	return r
}

// A cancelled request ends its wait at once, with the refusal.
func TestCancelDuringWait(t *testing.T) {
	srv, n := plain(t, 100, 429, map[string]string{"Retry-After": "3"})
	ctx, cancel := context.WithCancel(context.Background())
	answered := make(chan struct{}) // the first refusal is back: the transport waits
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		defer close(answered)
		return http.DefaultTransport.RoundTrip(r)
	})
	var wg sync.WaitGroup
	wg.Add(1)
	var code int
	go func() {
		defer wg.Done()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := (&http.Client{Transport: &client.Transport{Base: base}}).Do(req)
		if err == nil {
			code = resp.StatusCode
			resp.Body.Close()
		}
	}()
	<-answered
	start := time.Now()
	cancel()
	wg.Wait()
	if took := time.Since(start); took > time.Second || code != 429 || n.Load() != 1 {
		t.Errorf("cancelled mid-wait: %d after %v and %d sends; want the 429 at once, 1 send", code, took, n.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
