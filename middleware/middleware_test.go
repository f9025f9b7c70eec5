package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/internal/leaktest"
	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.WriteString(w, "ok")
})

func mustNew(t testing.TB, s store.Store, lim store.Limit, opts ...middleware.Option) *middleware.Limiter {
	t.Helper()
	l, err := middleware.New(s, lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func get(t testing.TB, client *http.Client, url string, hdr ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func wantHeader(t testing.TB, resp *http.Response, name, want string) {
	t.Helper()
	if got := resp.Header.Get(name); got != want {
		t.Errorf("%s: got %q, want %q", name, got, want)
	}
}

// burstThenRecover runs the main job over real HTTP: a burst of 3 passes,
// the 4th gets 429 with exact headers, and after Retry-After seconds
// requests pass again.
func burstThenRecover(t *testing.T, s store.Store) {
	lim := store.Limit{Rate: 1, Period: 2 * time.Second, Burst: 3}
	l := mustNew(t, s, lim, middleware.WithName("api"))
	srv := httptest.NewServer(l.Handler(okHandler))
	defer srv.Close()
	client := srv.Client()

	for i, wantRemaining := range []string{"2", "1", "0"} {
		resp := get(t, client, srv.URL)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200", i+1, resp.StatusCode)
		}
		wantHeader(t, resp, "RateLimit-Policy", `"api";q=1;w=2`) // the rate; the burst is RateLimit-Limit
		wantHeader(t, resp, "RateLimit-Limit", "3")
		wantHeader(t, resp, "RateLimit-Remaining", wantRemaining)
		wantHeader(t, resp, "RateLimit", `"api";r=`+wantRemaining+`;t=2`)
		wantHeader(t, resp, "RateLimit-Reset", "2")
		wantHeader(t, resp, "Retry-After", "")
	}
	resp := get(t, client, srv.URL)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("4th request: status %d, want 429", resp.StatusCode)
	}
	wantHeader(t, resp, "Retry-After", "2")
	wantHeader(t, resp, "RateLimit", `"api";r=0;t=2`)
	wantHeader(t, resp, "RateLimit-Policy", `"api";q=1;w=2`) // the rate; the burst is RateLimit-Limit
	wantHeader(t, resp, "RateLimit-Remaining", "0")
	wantHeader(t, resp, "Cache-Control", "no-store")

	time.Sleep(2 * time.Second)
	resp = get(t, client, srv.URL)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after Retry-After: status %d, want 200", resp.StatusCode)
	}
	wantHeader(t, resp, "RateLimit-Remaining", "0")
}

func TestBurstThenRecoverMemory(t *testing.T) {
	t.Parallel()
	m := store.NewMemory()
	defer m.Close()
	burstThenRecover(t, m)
}

func TestBurstThenRecoverRedis(t *testing.T) {
	t.Parallel()
	burstThenRecover(t, store.NewRedis(redistest.Server(t).Client(t), store.WithKeyPrefix(t.Name()+":")))
}

func TestBurstThenRecoverCluster(t *testing.T) {
	t.Parallel()
	burstThenRecover(t, store.NewRedis(redistest.Cluster(t).Client(t), store.WithKeyPrefix(t.Name()+":")))
}

func userKey(r *http.Request) (string, error) {
	if u := r.Header.Get("X-User"); u != "" {
		return "user:" + u, nil
	}
	return "", keyfuncs.ErrNoKey
}

func TestTwoLimitersOneRoute(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	perUser := mustNew(t, m, store.PerMinute(2), middleware.WithName("per-user"), middleware.WithKeyFunc(userKey))
	perRoute := mustNew(t, m, store.PerMinute(3), middleware.WithName("per-route"), middleware.WithKeyFunc(mustKey(keyfuncs.Static("route:/items"))))
	srv := httptest.NewServer(perRoute.Handler(perUser.Handler(okHandler)))
	defer srv.Close()
	c := srv.Client()

	resp := get(t, c, srv.URL, "X-User", "ann")
	wantHeader(t, resp, "RateLimit-Policy", `"per-route";q=3;w=60, "per-user";q=2;w=60`)
	wantHeader(t, resp, "RateLimit", `"per-route";r=2;t=20, "per-user";r=1;t=30`)
	wantHeader(t, resp, "RateLimit-Remaining", "1") // the tighter
	wantHeader(t, resp, "RateLimit-Limit", "2")

	resp = get(t, c, srv.URL, "X-User", "ann")
	wantHeader(t, resp, "RateLimit", `"per-route";r=1;t=20, "per-user";r=0;t=30`)
	// ann's own limit now decides.
	resp = get(t, c, srv.URL, "X-User", "ann")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("ann's 3rd request: %d, want 429 from per-user", resp.StatusCode)
	}
	wantHeader(t, resp, "RateLimit", `"per-route";r=0;t=20, "per-user";r=0;t=30`)
	wantHeader(t, resp, "Retry-After", "30")
	// bob has his own per-user bucket, but the route is exhausted now.
	resp = get(t, c, srv.URL, "X-User", "bob")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("bob: %d, want 429 from per-route", resp.StatusCode)
	}
	wantHeader(t, resp, "RateLimit", `"per-route";r=0;t=20`)
	wantHeader(t, resp, "Retry-After", "20")
}

func TestStoreFailure(t *testing.T) {
	const budget = 50 * time.Millisecond
	for _, down := range []struct {
		name string
		addr func(testing.TB) string
	}{{"closed port", redistest.ClosedAddr}, {"hanging", redistest.HangingAddr}} {
		for _, tc := range []struct {
			policy     middleware.FailurePolicy
			status     int
			retryAfter string
		}{
			{middleware.FailOpen, 200, ""},
			{middleware.FailClosed, 503, "1"},
		} {
			t.Run(down.name+"/"+tc.policy.String(), func(t *testing.T) {
				rdb := redis.NewClient(&redis.Options{Addr: down.addr(t), MaxRetries: -1, ContextTimeoutEnabled: true})
				t.Cleanup(func() { rdb.Close() })
				var errs atomic.Int64
				l := mustNew(t, store.NewRedis(rdb), store.PerSecond(10),
					middleware.WithFailurePolicy(tc.policy), middleware.WithTimeout(budget),
					on(middleware.EventError, func(middleware.Event) { errs.Add(1) }))
				h := l.Handler(okHandler)
				var worst time.Duration
				for range 10 {
					w := httptest.NewRecorder()
					start := time.Now()
					h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
					worst = max(worst, time.Since(start))
					if w.Code != tc.status {
						t.Fatalf("status %d, want %d", w.Code, tc.status)
					}
					if got := w.Header().Get("Retry-After"); got != tc.retryAfter {
						t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
					}
					if got := w.Header().Get("RateLimit"); got != "" {
						t.Errorf("RateLimit %q on a request the store did not decide", got)
					}
				}
				if worst > budget+20*time.Millisecond {
					t.Errorf("slowest answer %v; want within the budget %v + 20ms", worst, budget)
				}
				if errs.Load() != 10 || l.Stats().StoreErrors != 10 {
					t.Errorf("error hook %d times, StoreErrors %d; want 10 each", errs.Load(), l.Stats().StoreErrors)
				}
				t.Logf("slowest of 10: %v", worst)
			})
		}
	}
}

// countingStore counts Takes.
type countingStore struct {
	store.Store
	n atomic.Int64
}

func (c *countingStore) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	c.n.Add(1)
	return c.Store.Take(ctx, key, lim, cost)
}

// A key the server's setup makes unreadable (Pattern on a limiter around the mux, PeerIP on a
// Unix socket) is a 500, logged once, not a 400 that blames every client.
func TestKeyMisconfigurationIs500(t *testing.T) {
	var logged bytes.Buffer
	var logMu sync.Mutex
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &logMu}, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	m := store.NewMemory()
	defer m.Close()
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", okHandler)
	pattern := mustNew(t, m, store.PerMinute(20), middleware.WithKeyFunc(keyfuncs.Pattern)).Handler(mux)
	peer := mustNew(t, m, store.PerMinute(20)).Handler(okHandler)
	for i := range 4 {
		h, r := pattern, httptest.NewRequest("GET", "/items/1", nil)
		if i%2 == 1 {
			h, r.RemoteAddr = peer, "@" // a Unix socket's peer
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusInternalServerError {
			t.Errorf("request %d: status %d %q; want 500", i, w.Code, w.Body.String())
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	if n := strings.Count(logged.String(), "key function is misconfigured"); n != 2 {
		t.Errorf("logged %d times, want once per limiter: %s", n, logged.String())
	}
}

func TestKeyErrorIsNeverShared(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	cs := &countingStore{Store: m}
	var hooked atomic.Int64
	l := mustNew(t, cs, store.PerMinute(1), middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-API-Key"))),
		on(middleware.EventError, func(e middleware.Event) {
			if errors.Is(e.Err, keyfuncs.ErrNoKey) {
				hooked.Add(1)
			}
		}))
	h := l.Handler(okHandler)
	for range 5 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != http.StatusBadRequest {
			t.Fatalf("no API key: status %d, want 400", w.Code)
		}
		if strings.Contains(w.Body.String(), "X-Api-Key") || strings.Contains(w.Body.String(), "keyfuncs") {
			t.Errorf("body shows the error: %q", w.Body.String())
		}
	}
	if cs.n.Load() != 0 {
		t.Errorf("store called %d times for requests without a key; want 0", cs.n.Load())
	}
	if hooked.Load() != 5 || l.Stats().KeyErrors != 5 {
		t.Errorf("hook saw %d ErrNoKey, KeyErrors = %d; want 5", hooked.Load(), l.Stats().KeyErrors)
	}
	// Two different keys still get their own buckets.
	for _, key := range []string{"a", "b"} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-API-Key", key)
		h.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Errorf("key %s: status %d, want 200", key, w.Code)
		}
	}
}

func TestCostOutOfRange(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	for _, cost := range []int{-1, 11} {
		l := mustNew(t, m, store.PerSecond(10), middleware.WithCost(func(*http.Request) int { return cost }))
		w := httptest.NewRecorder()
		l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != http.StatusBadRequest || w.Header().Get("Retry-After") != "" {
			t.Errorf("cost %d: status %d, Retry-After %q; want 400 and none", cost, w.Code, w.Header().Get("Retry-After"))
		}
	}
}

func TestDryRunNeverRefuses(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	var denied, allowed atomic.Int64
	l := mustNew(t, m, store.PerMinute(3), middleware.WithDryRun(true),
		middleware.WithObserver(middleware.ObserverFunc(func(e middleware.Event) {
			switch e.Kind {
			case middleware.EventDenied:
				if !e.DryRun || e.Result.Allowed || !strings.HasPrefix(e.Limiter, "3-per-1m@") || e.Request == nil {
					t.Errorf("denied event %+v", e)
				}
				denied.Add(1)
			case middleware.EventAllowed:
				allowed.Add(1)
			}
		})))
	h := l.Handler(okHandler)
	for i := range 10 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != 200 {
			t.Fatalf("request %d: status %d in dry-run, want 200", i, w.Code)
		}
		if w.Header().Get("RateLimit") != "" || w.Header().Get("Retry-After") != "" {
			t.Errorf("dry-run wrote rate-limit headers: %v", w.Header())
		}
	}
	if allowed.Load() != 3 || denied.Load() != 7 {
		t.Errorf("allowed %d, would-be denied %d; want 3 and 7", allowed.Load(), denied.Load())
	}
}

// Dry-run serves, and counts, the requests the limiter cannot rate too: a
// KeyFunc error or a cost above Burst, in a Limiter and in a Multi.
func TestDryRunServesUnrated(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	noKey := middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Api-Key")))
	tooDear := middleware.WithCost(func(*http.Request) int { return 100 })
	for _, tc := range []struct {
		name string
		opt  middleware.Option
	}{{"key error", noKey}, {"cost above burst", tooDear}} {
		var errs atomic.Int64
		opts := []middleware.Option{middleware.WithDryRun(true), tc.opt,
			on(middleware.EventError, func(middleware.Event) { errs.Add(1) })}
		l := mustNew(t, m, store.PerMinute(3), opts...)
		multi, err := middleware.NewMulti(m, []middleware.Policy{{Name: "p", Limit: store.PerMinute(3)}}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for name, h := range map[string]http.Handler{"Limiter": l.Handler(okHandler), "Multi": multi.Handler(okHandler)} {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
			if w.Code != http.StatusOK {
				t.Errorf("%s, %s, dry-run: status %d, want 200", name, tc.name, w.Code)
			}
		}
		if errs.Load() != 2 {
			t.Errorf("%s: %d errors reported, want 2 (one per middleware)", tc.name, errs.Load())
		}
		if l.Stats().KeyErrors != 1 {
			t.Errorf("%s: Stats().KeyErrors = %d, want 1", tc.name, l.Stats().KeyErrors)
		}
	}
}

func TestSkipBeforeStore(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	cs := &countingStore{Store: m}
	l := mustNew(t, cs, store.PerSecond(1), middleware.WithSkip(func(r *http.Request) bool { return r.URL.Path == "/healthz" }),
		middleware.WithKeyFunc(func(*http.Request) (string, error) { t.Error("KeyFunc called for a skipped request"); return "x", nil }))
	for range 5 {
		w := httptest.NewRecorder()
		l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
		if w.Code != 200 || w.Header().Get("RateLimit") != "" {
			t.Errorf("skipped request: %d %v", w.Code, w.Header())
		}
	}
	if cs.n.Load() != 0 {
		t.Errorf("store called %d times for skipped requests", cs.n.Load())
	}
}

func TestProblemDetails(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	l := mustNew(t, m, store.PerMinute(1), middleware.WithProblemDetails(), middleware.WithName(`login "strict"`))
	h := l.Handler(okHandler)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("status %d, Content-Type %q", w.Code, w.Header().Get("Content-Type"))
	}
	var doc struct {
		Type     string   `json:"type"`
		Title    string   `json:"title"`
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	if doc.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || doc.Status != 429 ||
		len(doc.Violated) != 1 || doc.Violated[0] != `login "strict"` {
		t.Errorf("problem document %+v", doc)
	}
	wantHeader(t, &http.Response{Header: w.Header()}, "RateLimit", `"login \"strict\"";r=0;t=60`)
}

// A Multi's problem document names the policy that refused the request.
func TestProblemDetailsNameMultiPolicy(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	mu, err := middleware.NewMulti(m, []middleware.Policy{
		{Name: "roomy", Limit: store.PerMinute(100)},
		{Name: "strict", Limit: store.PerMinute(1)},
	}, middleware.WithProblemDetails())
	if err != nil {
		t.Fatal(err)
	}
	h := mu.Handler(okHandler)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	var doc struct {
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &doc); err != nil || w.Code != 429 {
		t.Fatalf("status %d, body %q: %v", w.Code, w.Body.String(), err)
	}
	if len(doc.Violated) != 1 || doc.Violated[0] != "strict" {
		t.Errorf("violated-policies %q, want [strict]", doc.Violated)
	}
}

func TestCustomDeniedHandler(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	l := mustNew(t, m, store.PerMinute(1), middleware.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res store.Result) {
		if res.Allowed || res.RetryAfter <= 0 {
			t.Errorf("denied handler got %+v", res)
		}
		w.WriteHeader(http.StatusTeapot)
	}))
	h := l.Handler(okHandler)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if w.Code != http.StatusTeapot || w.Header().Get("Retry-After") != "60" {
		t.Errorf("status %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}

func TestHeaderProfiles(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	for _, tc := range []struct {
		profile headers.Profile
		present []string
		absent  []string
	}{
		{0, nil, []string{"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "X-RateLimit-Limit"}},
		{headers.Draft11, []string{"RateLimit", "RateLimit-Policy"}, []string{"RateLimit-Limit", "X-RateLimit-Limit"}},
		{headers.Draft03, []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}, []string{"RateLimit", "X-RateLimit-Limit"}},
		{headers.XRateLimitDelta, []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}, []string{"RateLimit"}},
	} {
		l := mustNew(t, m, store.PerMinute(5), middleware.WithHeaders(tc.profile), middleware.WithKeyFunc(mustKey(keyfuncs.Static(t.Name()))))
		w := httptest.NewRecorder()
		l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		for _, h := range tc.present {
			if w.Header().Get(h) == "" {
				t.Errorf("profile %v: %s missing", tc.profile, h)
			}
		}
		for _, h := range tc.absent {
			if w.Header().Get(h) != "" {
				t.Errorf("profile %v: %s present", tc.profile, h)
			}
		}
	}
}

func TestNewValidates(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	for name, tc := range map[string]struct {
		s    store.Store
		lim  store.Limit
		opts []middleware.Option
	}{
		"nil store":       {nil, store.PerSecond(1), nil},
		"nil *Memory":     {(*store.Memory)(nil), store.PerSecond(1), nil},
		"nil *Redis":      {(*store.Redis)(nil), store.PerSecond(1), nil},
		"invalid limit":   {m, store.Limit{Rate: 0, Period: time.Second, Burst: 1}, nil},
		"zero timeout":    {m, store.PerSecond(1), []middleware.Option{middleware.WithTimeout(0)}},
		"negative retry":  {m, store.PerSecond(1), []middleware.Option{middleware.WithFailurePolicy(middleware.FailClosedWith(503, -time.Second))}},
		"empty name":      {m, store.PerSecond(1), []middleware.Option{middleware.WithName("")}},
		"control in name": {m, store.PerSecond(1), []middleware.Option{middleware.WithName("a\nb")}},
		"brace in name":   {m, store.PerSecond(1), []middleware.Option{middleware.WithName("a}b")}},
		"colon in name":   {m, store.PerSecond(1), []middleware.Option{middleware.WithName("x:ip")}},
		"nil key func":    {m, store.PerSecond(1), []middleware.Option{middleware.WithKeyFunc(nil)}},
		"bad status":      {m, store.PerSecond(1), []middleware.Option{middleware.WithFailurePolicy(middleware.FailClosedWith(200, time.Second))}},
		"429, no retry":   {m, store.PerSecond(1), []middleware.Option{middleware.WithFailurePolicy(middleware.FailClosedWith(429, 0))}},
		"no replicas":     {m, store.PerSecond(1), []middleware.Option{middleware.WithFailurePolicy(middleware.FailLocalShare(0))}},
		"two X modes":     {m, store.PerSecond(1), []middleware.Option{middleware.WithHeaders(headers.XRateLimitEpoch | headers.XRateLimitDelta)}},
	} {
		if l, err := middleware.New(tc.s, tc.lim, tc.opts...); err == nil || l != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, l, err)
		}
	}
}

func TestDefaultName(t *testing.T) {
	for _, tc := range []struct {
		lim  store.Limit
		want string
	}{
		{store.PerMinute(100), "100-per-1m"},
		{store.PerSecond(5), "5-per-1s"},
		{store.PerHour(1000), "1000-per-1h"},
		{store.Limit{Rate: 5, Period: time.Second, Burst: 10}, "5-per-1s-burst-10"},
		{store.Limit{Rate: 1, Period: 1500 * time.Millisecond, Burst: 1}, "1-per-1500ms"},
	} {
		if got := middleware.DefaultName(tc.lim); got != tc.want {
			t.Errorf("DefaultName(%v) = %q, want %q", tc.lim, got, tc.want)
		}
	}
}

func TestNextToken(t *testing.T) {
	lim := store.PerSecond(5) // a token every 200ms
	for _, tc := range []struct {
		remaining int
		reset     time.Duration
		want      time.Duration
	}{
		{5, 0, 0},
		{4, 200 * time.Millisecond, 200 * time.Millisecond},
		{0, time.Second, 200 * time.Millisecond},
		{0, 900 * time.Millisecond, 100 * time.Millisecond},
		{2, 550 * time.Millisecond, 150 * time.Millisecond},
	} {
		got := middleware.NextToken(store.Result{Limit: lim, Remaining: tc.remaining, ResetAfter: tc.reset})
		if got != tc.want {
			t.Errorf("NextToken(remaining %d, reset %v) = %v, want %v", tc.remaining, tc.reset, got, tc.want)
		}
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	leaktest.Check(t)
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	l := mustNew(t, store.NewRedis(rdb), store.PerSecond(100))
	srv := httptest.NewServer(l.Handler(okHandler))
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	for range 50 {
		get(t, srv.Client(), srv.URL)
	}
}

// The client's deadline, under a quarter of the limiter's budget, ends the
// call, or the client leaves: the store is not to blame, and nothing is
// answered. With ContextTimeoutEnabled the go-redis error usually comes back
// before the context's own timer has marked it done, so several requests are
// sent. (A longer deadline that passes: TestRedisHungShortDeadlines.)
func TestClientGoneIsNotAStoreError(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: redistest.HangingAddr(t), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	var hooked, served atomic.Int64
	h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) })
	for _, policy := range []middleware.FailurePolicy{middleware.FailOpen, middleware.FailClosed, middleware.FailLocal} {
		opts := []middleware.Option{middleware.WithFailurePolicy(policy),
			on(middleware.EventError, func(middleware.Event) { hooked.Add(1) })}
		l := mustNew(t, store.NewRedis(rdb), store.PerSecond(10), opts...)
		multi, err := middleware.NewMulti(store.NewRedis(rdb), []middleware.Policy{{Name: "p", Limit: store.PerSecond(10)}}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name  string
			h     http.Handler
			stats func() middleware.Stats
		}{{"Limiter", l.Handler(h), l.Stats}, {"Multi", multi.Handler(h), multi.Stats}} {
			for i := range 4 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond) // a deadline the app set
				if i%2 == 1 {                                                                 // or a client that gives up
					ctx, cancel = context.WithCancel(context.Background())
					time.AfterFunc(20*time.Millisecond, cancel)
				}
				w := httptest.NewRecorder()
				tc.h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
				cancel()
				if tc.stats().StoreErrors != 0 || hooked.Load() != 0 || served.Load() != 0 ||
					w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "deadline passed") {
					t.Fatalf("%v, %s, request %d: StoreErrors %d, hook %d, served %d, response %d %q; want nothing counted, "+
						"not served, and a 503 (not an empty 200, which a client whose app deadline passed reads as success)",
						policy, tc.name, i, tc.stats().StoreErrors, hooked.Load(), served.Load(), w.Code, w.Body.String())
				}
			}
		}
	}
}

// A request's bucket is the Redis key "<prefix><name>:<subject>"; a subject
// that holds a brace is wrapped with the name in one, so that its own brace
// does not become the Cluster hash tag.
func TestStoreKeyShape(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	for _, tc := range []struct {
		name, subject string
		peer          bool
		want          string
	}{
		{name: "api", subject: "key:abc", want: "tollgate:api:key:abc"},
		{name: "route", subject: "route:GET /items/{id}", want: "tollgate:{route:route:GET /items/{id}}"},
		{name: "closing", subject: "a}b", want: "tollgate:closing:a}b"},
		{name: "ip", peer: true, want: "tollgate:ip:ip:192.0.2.1"},
	} {
		opts := []middleware.Option{middleware.WithName(tc.name)}
		if !tc.peer {
			opts = append(opts, middleware.WithKeyFunc(mustKey(keyfuncs.Static(tc.subject))))
		}
		l := mustNew(t, store.NewRedis(rdb), store.PerMinute(10), opts...)
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		l.Handler(okHandler).ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: status %d", tc.want, w.Code)
		}
		if !mr.Exists(tc.want) {
			t.Errorf("no Redis key %q; keys: %q", tc.want, mr.Keys())
		}
	}
}

// Hooks get the subject of a request keyed by the peer's address, and an
// allow-listed key matches it.
func TestPeerIPSubjectInHooks(t *testing.T) {
	var got string
	l := mustNew(t, store.NewMemory(), store.PerMinute(10),
		on(middleware.EventAllowed, func(e middleware.Event) { got = e.Key }))
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	l.Handler(okHandler).ServeHTTP(httptest.NewRecorder(), r)
	if got != "ip:192.0.2.1" {
		t.Errorf("Event.Key = %q, want %q", got, "ip:192.0.2.1")
	}
}

// A store that cannot decide anything is a constructor error, not a
// limiter whose every request meets the failure policy.
func TestNewRefusesRedisWithoutClient(t *testing.T) {
	if _, err := middleware.New(store.NewRedis(nil), store.PerSecond(1)); err == nil {
		t.Error("New(store.NewRedis(nil)) = nil error; want one")
	}
	if _, err := middleware.NewMulti(store.NewRedis(nil), []middleware.Policy{{Limit: store.PerSecond(1)}}); err == nil {
		t.Error("NewMulti(store.NewRedis(nil)) = nil error; want one")
	}
}

// A go-redis client that does not end calls at the context's deadline
// would hold every request for its own timeouts when Redis stalls, beyond
// WithTimeout's budget: New and NewMulti refuse it and say what to set, and
// accept the same client with ContextTimeoutEnabled. A client type the
// store cannot read the options of is refused too.
func TestNewRefusesRedisWithoutContextTimeout(t *testing.T) {
	addr := redistest.ClosedAddr(t) // never dialled: the constructors only check
	for _, tc := range []struct {
		name   string
		client func(ctxTimeout bool) redis.UniversalClient
	}{
		{"client", func(on bool) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: on})
		}},
		{"cluster", func(on bool) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: on})
		}},
		{"ring", func(on bool) redis.UniversalClient {
			return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: on})
		}},
		{"failover", func(on bool) redis.UniversalClient {
			return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr}, ContextTimeoutEnabled: on})
		}},
		{"universal", func(on bool) redis.UniversalClient {
			return redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, ContextTimeoutEnabled: on})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client(false)
			t.Cleanup(func() { c.Close() })
			_, err := middleware.New(store.NewRedis(c), store.PerSecond(1))
			if err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
				t.Errorf("New: error %v; want one that mentions ContextTimeoutEnabled", err)
			}
			_, err = middleware.NewMulti(store.NewRedis(c), []middleware.Policy{{Limit: store.PerSecond(1)}})
			if err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
				t.Errorf("NewMulti: error %v; want one that mentions ContextTimeoutEnabled", err)
			}
			ok := tc.client(true)
			t.Cleanup(func() { ok.Close() })
			if _, err := middleware.New(store.NewRedis(ok), store.PerSecond(1)); err != nil {
				t.Errorf("New with ContextTimeoutEnabled: %v", err)
			}
		})
	}
	t.Run("unknown client type", func(t *testing.T) {
		c := wrappedClient{redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})}
		t.Cleanup(func() { c.Close() })
		if _, err := middleware.New(store.NewRedis(c), store.PerSecond(1)); err == nil {
			t.Error("New: nil error for a client that is not a *redis.Client, *redis.ClusterClient or *redis.Ring; want one")
		}
	})
}

// wrappedClient is a redis.UniversalClient of a type the store does not know.
type wrappedClient struct{ *redis.Client }

// TestPolicyStatesTheRate checks RateLimit-Policy against the limit on both
// paths: q/w is Rate/Period, and the burst is what RateLimit-Limit and a
// full bucket's r report.
func TestPolicyStatesTheRate(t *testing.T) {
	lim := store.Limit{Rate: 100, Period: time.Minute, Burst: 10}
	mem := store.NewMemory()
	defer mem.Close()
	one := mustNew(t, mem, lim, middleware.WithName("one"))
	multi, err := middleware.NewMulti(mem, []middleware.Policy{
		{Name: "fast", Limit: store.Limit{Rate: 5, Period: 500 * time.Millisecond, Burst: 5}},
		{Name: "slow", Limit: lim},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		h           http.Handler
		policy, lim string
	}{
		{one.Handler(okHandler), `"one";q=100;w=60`, "10"},
		{multi.Handler(okHandler), `"fast";q=10;w=1, "slow";q=100;w=60`, "5"},
	} {
		w := httptest.NewRecorder()
		tc.h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if got := w.Header().Get("RateLimit-Policy"); got != tc.policy {
			t.Errorf("RateLimit-Policy %q, want %q", got, tc.policy)
		}
		if got := w.Header().Get("RateLimit-Limit"); got != tc.lim {
			t.Errorf("RateLimit-Limit %q, want %q (the burst)", got, tc.lim)
		}
	}
}

// TestDefaultNamesNeverShare: two limiters of one limit, made in two places
// or in a loop, count separately by default; WithName is how limiters (the
// replicas of one, or route groups meant to share a budget) share buckets.
func TestDefaultNamesNeverShare(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim := store.PerMinute(2)
	login := mustNew(t, m, lim)
	api := mustNew(t, m, lim)
	var loop []*middleware.Limiter
	for range 2 {
		l, err := middleware.New(m, lim)
		if err != nil {
			t.Fatal(err)
		}
		loop = append(loop, l)
	}
	names := map[string]bool{}
	for _, l := range append([]*middleware.Limiter{login, api}, loop...) {
		if !strings.HasPrefix(l.Name(), "2-per-1m@") || names[l.Name()] {
			t.Errorf("default name %q: want 2-per-1m@<site>, unique", l.Name())
		}
		names[l.Name()] = true
	}
	serve := func(l *middleware.Limiter) int {
		w := httptest.NewRecorder()
		l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Code
	}
	for i := range 2 {
		if c := serve(login); c != 200 {
			t.Fatalf("login request %d: %d", i, c)
		}
	}
	if c := serve(login); c != 429 {
		t.Errorf("third login request: %d, want 429", c)
	}
	if c := serve(api); c != 200 {
		t.Errorf("api after login's burst: %d, want 200 (its own buckets)", c)
	}
	// Named alike, two limiters (as two replicas would) share one budget.
	a, b := mustNew(t, m, lim, middleware.WithName("shared")), mustNew(t, m, lim, middleware.WithName("shared"))
	if serve(a) != 200 || serve(b) != 200 || serve(a) != 429 {
		t.Errorf("limiters named alike do not share their buckets")
	}
}

// mustKey returns kf, failing the process on err: for KeyFuncs built from
// arguments known to be good.
func mustKey(kf keyfuncs.KeyFunc, err error) keyfuncs.KeyFunc {
	if err != nil {
		panic(err)
	}
	return kf
}

// on is an Observer that calls fn for the events of kind.
func on(kind middleware.EventKind, fn func(middleware.Event)) middleware.Option {
	return middleware.WithObserver(middleware.ObserverFunc(func(e middleware.Event) {
		if e.Kind == kind {
			fn(e)
		}
	}))
}

// quiet is an Observer that drops every event: a limiter without one logs
// its breaker's transitions.
var quiet = middleware.WithObserver(middleware.ObserverFunc(func(middleware.Event) {}))

// patient lifts the decision budget, for tests that check what a real
// store decides: on a loaded machine a call to miniredis or Redis under the
// race detector can outlast the default 100 ms, and the request be decided
// by the failure policy instead.
var patient = middleware.WithTimeout(time.Minute)

// StoreKey names the bucket a request of the subject is decided on, for a
// Limiter (a brace in the subject included) and a Multi's first policy.
func TestStoreKey(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim := store.PerMinute(10)
	for _, subject := range []string{"ip:192.0.2.1", "route:GET /items/{id}"} {
		key, err := keyfuncs.Static(subject)
		if err != nil {
			t.Fatal(err)
		}
		l := mustNew(t, m, lim, middleware.WithName("sk"), middleware.WithKeyFunc(key))
		multi, err := middleware.NewMulti(m, []middleware.Policy{{Name: "skm", Limit: lim}}, middleware.WithKeyFunc(key))
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range []*middleware.Limiter{l, multi.Limiter} {
			h.Handler(okHandler).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
			if r, err := m.Take(context.Background(), h.StoreKey(subject), lim, 0); err != nil || r.Remaining != 9 {
				t.Errorf("%s: the bucket StoreKey(%q) = %q names holds %d (%v); want 9: the request's", h.Name(), subject, h.StoreKey(subject), r.Remaining, err)
			}
		}
	}
}

// A refund gives a costly request's tokens back to FailLocalShare's mirror
// too, at most the share's burst, as its take took: a cost of 20 over a
// local burst of 10, refunded, leaves the share full for an outage.
func TestFailLocalShareRefundOverShare(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	l := mustNew(t, store.NewRedis(rdb), store.PerMinute(100), middleware.WithFailurePolicy(middleware.FailLocalShare(10)),
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("k"))), middleware.WithBreaker(0, time.Second),
		middleware.WithCost(func(r *http.Request) int { n, _ := strconv.Atoi(r.Header.Get("X-Cost")); return n }),
		middleware.WithRefund(func(*http.Request, int) bool { return true }))
	h := l.Handler(okHandler)
	serve := func(cost string) int {
		w, r := httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Cost", cost)
		h.ServeHTTP(w, r)
		return w.Code
	}
	if code := serve("20"); code != 200 {
		t.Fatalf("cost 20 on a healthy store: %d", code)
	}
	mr.Close() // the outage: the local share decides
	var codes []int
	for range 5 {
		codes = append(codes, serve("1"))
	}
	if !slices.Equal(codes, []int{200, 200, 200, 200, 200}) {
		t.Errorf("after a refunded cost of 20, 5 requests of cost 1 in the outage: %v; want 200s (the share full again)", codes)
	}
}
