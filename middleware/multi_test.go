package middleware_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

var okHandlerFunc = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

func serveUser(h http.Handler, user string, hdr ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-User", user)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w
}

// multiStores runs f on Memory, a real redis-server and a real Cluster.
func multiStores(t *testing.T, f func(t *testing.T, s store.Store)) {
	t.Run("memory", func(t *testing.T) {
		m := store.NewMemory()
		defer m.Close()
		f(t, m)
	})
	t.Run("redis", func(t *testing.T) {
		f(t, store.NewRedis(redistest.Server(t).Client(t), store.WithKeyPrefix(t.Name()+":")))
	})
	t.Run("cluster", func(t *testing.T) {
		f(t, store.NewRedis(redistest.Cluster(t).Client(t), store.WithKeyPrefix(t.Name()+":")))
	})
}

// A per-user limit and a global limit: a request the global limit refuses
// takes nothing from the user's bucket, read back from the store.
func TestMultiDeniedConsumesNothing(t *testing.T) {
	multiStores(t, func(t *testing.T, s store.Store) {
		perUser := store.Limit{Rate: 5, Period: time.Hour, Burst: 5}
		global := store.Limit{Rate: 20, Period: time.Hour, Burst: 20}
		m, err := middleware.NewMulti(s, []middleware.Policy{
			{Name: "per-user", Limit: perUser},
			{Name: "global", Limit: global, Key: mustKey(keyfuncs.Static("all"))},
		}, middleware.WithKeyFunc(userKey), patient)
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(okHandlerFunc)
		allowed := map[string]int{}
		total := 0
		// 10 users, 10 rounds: the global limit runs out after 20.
		for round := range 10 {
			for u := range 10 {
				user := fmt.Sprintf("u%d", u)
				w := serveUser(h, user)
				switch w.Code {
				case 200:
					allowed[user]++
					total++
				case 429:
				default:
					t.Fatalf("round %d, %s: status %d", round, user, w.Code)
				}
				if round == 0 && u == 0 {
					got := w.Header().Values("RateLimit")
					if len(got) != 1 || got[0] != `"per-user";r=4;t=720, "global";r=19;t=180` {
						t.Errorf("RateLimit = %q; want both policies", got)
					}
					// The single-value trio reports the tightest policy.
					if l, r := w.Header().Get("RateLimit-Limit"), w.Header().Get("RateLimit-Remaining"); l != "5" || r != "4" {
						t.Errorf("RateLimit-Limit %q, -Remaining %q; want the per-user policy's 5 and 4", l, r)
					}
				}
			}
		}
		if total != 20 {
			t.Errorf("%d requests allowed in all; want the global 20", total)
		}
		ctx := context.Background()
		for user, n := range allowed {
			if n > 5 {
				t.Errorf("%s: %d allowed; want at most 5", user, n)
			}
			// Read the user's bucket back: only the allowed requests took from it.
			res, err := s.Take(ctx, "per-user:{user:"+user+"}", perUser, 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.Remaining != 5-n {
				t.Errorf("%s: bucket holds %d after %d allowed; want %d (denied requests consumed nothing)", user, res.Remaining, n, 5-n)
			}
		}
		// A denial's Retry-After is the global's, the violated policy.
		w := serveUser(h, "u9")
		if w.Code != 429 || w.Header().Get("Retry-After") != "180" {
			t.Errorf("denied by the global limit: %d, Retry-After %q; want 429, 180", w.Code, w.Header().Get("Retry-After"))
		}
	})
}

// Per-user 5/s and global 20/s, 10 users hammering for 5 s on a real
// redis-server: no user above 5/s, the total at most 20/s.
func TestMultiHammerRealRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("5 s of load")
	}
	client := redistest.Server(t).Client(t)
	s := store.NewRedis(client, store.WithKeyPrefix(t.Name()+":"))
	perUser, global := store.PerSecond(5), store.PerSecond(20)
	m, err := middleware.NewMulti(s, []middleware.Policy{
		{Name: "per-user", Limit: perUser},
		{Name: "global", Limit: global, Key: mustKey(keyfuncs.Static("all"))},
	}, middleware.WithKeyFunc(userKey), middleware.WithTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(okHandlerFunc)
	const users, d = 10, 5 * time.Second
	var allowed [users]atomic.Int64
	var other atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for u := range users {
		for range 2 { // two clients per user
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < d {
					switch serveUser(h, fmt.Sprintf("u%d", u)).Code {
					case 200:
						allowed[u].Add(1)
					case 429:
					default:
						other.Add(1)
					}
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	total := int64(0)
	for u := range users {
		n := allowed[u].Load()
		total += n
		// Burst 5 plus 5/s over the run.
		if max := int64(5 + 5*elapsed + 1); n > max {
			t.Errorf("user %d: %d allowed in %.1fs; want at most %d (5/s, burst 5)", u, n, elapsed, max)
		}
	}
	maxTotal := int64(20 + 20*elapsed + 1)
	t.Logf("%d users, %.1fs: %d allowed in all (%.1f/s; at most %d), per user %v; %d errors",
		users, elapsed, total, float64(total)/elapsed, maxTotal, loads(allowed[:]), other.Load())
	if total > maxTotal {
		t.Errorf("%d allowed in all; want at most %d (20/s, burst 20)", total, maxTotal)
	}
	if total < int64(0.9*float64(maxTotal)) {
		t.Errorf("%d allowed in all; want close to the global limit %d", total, maxTotal)
	}
	if other.Load() != 0 {
		t.Errorf("%d answers other than 200 and 429", other.Load())
	}
}

func loads(a []atomic.Int64) []int64 {
	out := make([]int64, len(a))
	for i := range a {
		out[i] = a[i].Load()
	}
	return out
}

// 5 failed logins per minute; successes are refunded, so they never count.
func TestRefundFailedLogins(t *testing.T) {
	multiStores(t, func(t *testing.T, s store.Store) {
		login := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("X-Password") == "right" {
				w.WriteHeader(http.StatusOK)
				return
			}
			w.WriteHeader(http.StatusUnauthorized)
		})
		failed := func(r *http.Request, status int) bool { return status < 400 } // refund successes
		l := mustNew(t, s, store.PerMinute(5), middleware.WithName("login"), middleware.WithKeyFunc(userKey), patient,
			middleware.WithRefund(failed))
		h := l.Handler(login)
		failures, refusedAt := 0, 0
		for i := range 20 {
			pw := "wrong"
			if i%2 == 1 {
				pw = "right"
			}
			w := serveUser(h, "ann", "X-Password", pw)
			switch {
			case w.Code == 429:
				if refusedAt == 0 {
					refusedAt = failures + 1
				}
			case pw == "wrong":
				failures++
			}
			if pw == "right" && failures < 5 && w.Code != 200 {
				t.Errorf("attempt %d (a success, after %d failures): %d; want 200", i+1, failures, w.Code)
			}
		}
		if failures != 5 || refusedAt != 6 {
			t.Errorf("%d failures went through, first refusal at failure %d; want 5 and the 6th refused", failures, refusedAt)
		}
		// Successes gave their token back: another user's 10 successes
		// leave the bucket full.
		for range 10 {
			if w := serveUser(h, "bob", "X-Password", "right"); w.Code != 200 {
				t.Fatalf("bob's success: %d", w.Code)
			}
		}
		res, err := s.Take(context.Background(), "login:user:bob", store.PerMinute(5), 0)
		if err != nil || res.Remaining != 5 {
			t.Errorf("bob's bucket after 10 successes: %+v, %v; want full (5)", res, err)
		}
	})
}

// Free 10/min and pro 100/min in one middleware, chosen per request; an
// unknown plan gets the default (free).
func TestTiers(t *testing.T) {
	multiStores(t, func(t *testing.T, s store.Store) {
		m, err := middleware.NewTiered(s, middleware.Tiers{
			Of: func(r *http.Request) string { return r.Header.Get("X-Plan") },
			Plans: map[string][]middleware.Policy{
				"free": {{Name: "per-minute", Limit: store.PerMinute(10)}},
				"pro":  {{Name: "per-minute", Limit: store.PerMinute(100)}},
			},
			Default: "free",
		}, middleware.WithKeyFunc(userKey), patient)
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(okHandlerFunc)
		count := func(user, plan string) (ok int, policy string) {
			for range 150 {
				w := serveUser(h, user, "X-Plan", plan)
				if w.Code == 200 {
					ok++
					policy = w.Header().Get("RateLimit-Policy")
				}
			}
			return ok, policy
		}
		for _, tc := range []struct {
			user, plan string
			want       int
			policy     string
		}{
			{"f", "free", 10, `"per-minute";q=10;w=60`},
			{"p", "pro", 100, `"per-minute";q=100;w=60`},
			{"x", "platinum", 10, `"per-minute";q=10;w=60`}, // unknown: the default
			{"n", "", 10, `"per-minute";q=10;w=60`},
		} {
			ok, policy := count(tc.user, tc.plan)
			t.Logf("plan %q: %d of 150 allowed, %s", tc.plan, ok, policy)
			if ok != tc.want || policy != tc.policy {
				t.Errorf("plan %q: %d of 150 allowed under %q; want %d under %q", tc.plan, ok, policy, tc.want, tc.policy)
			}
		}
	})
}

// multiCounting counts store calls of a MultiStore.
type multiCounting struct {
	*store.Memory
	n atomic.Int64
}

func (c *multiCounting) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	c.n.Add(1)
	return c.Memory.Take(ctx, key, lim, cost)
}

func (c *multiCounting) TakeAll(ctx context.Context, reqs []store.Request) ([]store.Result, error) {
	c.n.Add(1)
	return c.Memory.TakeAll(ctx, reqs)
}

// Allow-listed networks and keys never reach the store.
func TestAllowList(t *testing.T) {
	cs := &multiCounting{Memory: store.NewMemory()}
	defer cs.Close()
	var events []middleware.Event
	var mu sync.Mutex
	obs := middleware.ObserverFunc(func(e middleware.Event) { mu.Lock(); events = append(events, e); mu.Unlock() })
	opts := []middleware.Option{middleware.WithAllowList("10.0.0.0/8", "2001:db8::1", "user:admin"),
		middleware.WithKeyFunc(userKey), middleware.WithObserver(obs)}
	l := mustNew(t, cs, store.PerMinute(1), opts...)
	m, err := middleware.NewMulti(cs, []middleware.Policy{{Limit: store.PerMinute(1)}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]http.Handler{"Limiter": l.Handler(okHandlerFunc), "Multi": m.Handler(okHandlerFunc)} {
		cs.n.Store(0)
		for _, tc := range []struct {
			remote, user string
			store        bool
		}{
			{"10.1.2.3:5000", "ann", false},
			{"[2001:db8::1]:5000", "ann", false},
			{"192.0.2.1:5000", "admin", false},
			{"192.0.2.1:5000", "ann", true},
		} {
			before := cs.n.Load()
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = tc.remote
			req.Header.Set("X-User", tc.user)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if asked := cs.n.Load() > before; asked != tc.store || w.Code != 200 {
				t.Errorf("%s, %s as %s: %d, store asked %v; want 200, store asked %v", name, tc.remote, tc.user, w.Code, asked, tc.store)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	skipped := 0
	for _, e := range events {
		if e.Kind == middleware.EventSkipped {
			skipped++
		}
	}
	if skipped != 6 {
		t.Errorf("%d skipped events; want 6", skipped)
	}
	if _, err := middleware.New(cs, store.PerMinute(1), middleware.WithAllowList("10.0.0.0/33")); err == nil {
		t.Error("WithAllowList(10.0.0.0/33): no error")
	}
}

// The observer sees every kind of event with the key's class, never the
// key; the slog adapter logs them.
func TestObserverEvents(t *testing.T) {
	var buf bytes.Buffer
	lg := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var mu sync.Mutex
	var events []middleware.Event
	obs := middleware.ObserverFunc(func(e middleware.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
		middleware.SlogObserver(lg).Observe(e)
	})
	// A store that fails on demand, behind a breaker of 2 failures.
	var fail atomic.Bool
	s := &failingStore{Store: store.NewMemory(), fail: &fail}
	l := mustNew(t, s, store.PerMinute(2), middleware.WithName("api"), middleware.WithKeyFunc(userKey), middleware.WithFailurePolicy(middleware.FailOpen),
		middleware.WithObserver(obs), middleware.WithBreaker(2, time.Hour), middleware.WithTimeout(time.Second))
	h := l.Handler(okHandlerFunc)
	serveUser(h, "secret-user-42")                                                     // allowed
	serveUser(h, "secret-user-42")                                                     // allowed
	serveUser(h, "secret-user-42")                                                     // denied
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil)) // key error
	fail.Store(true)
	serveUser(h, "bob") // error + fallback
	serveUser(h, "bob") // error + fallback, breaker opens
	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind.String())
		if e.Limiter != "api" {
			t.Errorf("event %v from limiter %q; want api", e.Kind, e.Limiter)
		}
		if (e.Kind == middleware.EventAllowed || e.Kind == middleware.EventDenied) && (e.KeyClass != "user" || e.Cost != 1) {
			t.Errorf("%v event: class %q cost %d; want user, 1", e.Kind, e.KeyClass, e.Cost)
		}
	}
	// The breaker opens during the second failed store call, before that
	// request reports its error.
	want := "allowed allowed denied error error fallback breaker error fallback"
	if got := strings.Join(kinds, " "); got != want {
		t.Errorf("events %q; want %q", got, want)
	}
	if strings.Contains(buf.String(), "secret-user-42") {
		t.Errorf("the raw key reached the log:\n%s", buf.String())
	}
	for _, s := range []string{"event=denied", "key_class=user", "event=fallback", "policy=FailOpen", "to=open"} {
		if !strings.Contains(buf.String(), s) {
			t.Errorf("log lacks %q:\n%s", s, buf.String())
		}
	}
}

type failingStore struct {
	store.Store
	fail *atomic.Bool
}

func (f *failingStore) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	if f.fail.Load() {
		return store.Result{}, redis.ErrClosed
	}
	return f.Store.Take(ctx, key, lim, cost)
}

func TestKeyClass(t *testing.T) {
	for key, want := range map[string]string{
		"ip:192.0.2.1":                 "ip",
		"user:42":                      "user",
		"key:abc":                      "key",
		"user:42|route:GET /items":     "user+route",
		"192.0.2.1":                    "other",
		"":                             "other",
		"user:42|nonsense":             "other",
		"weird:1":                      "other",
		"tier:pro|user:1|route:/x|ip:": "other",      // more than three kinds
		"user:a\\|ip:x|route:/":        "user+route", // an escaped bar inside a part
		"user:x|ip:|ip:|ip:":           "user+ip",    // repeats add nothing
	} {
		if got := middleware.KeyClass(key); got != want {
			t.Errorf("KeyClass(%q) = %q; want %q", key, got, want)
		}
	}
}

func TestNewMultiValidates(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	for name, f := range map[string]func() error{
		"store without TakeAll": func() error {
			_, err := middleware.NewMulti(&countingStore{Store: m}, []middleware.Policy{{Limit: store.PerMinute(1)}})
			return err
		},
		"no policies": func() error { _, err := middleware.NewMulti(m, nil); return err },
		"duplicate names": func() error {
			_, err := middleware.NewMulti(m, []middleware.Policy{{Name: "a", Limit: store.PerMinute(1)}, {Name: "a", Limit: store.PerHour(1)}})
			return err
		},
		"bad limit": func() error {
			_, err := middleware.NewMulti(m, []middleware.Policy{{Limit: store.Limit{}}})
			return err
		},
		"bad name": func() error {
			_, err := middleware.NewMulti(m, []middleware.Policy{{Name: "a:b", Limit: store.PerMinute(1)}})
			return err
		},
		"unknown default": func() error {
			_, err := middleware.NewTiered(m, middleware.Tiers{Of: func(*http.Request) string { return "" },
				Plans: map[string][]middleware.Policy{"pro": {{Limit: store.PerMinute(1)}}}, Default: "free"})
			return err
		},
		"plans without Of": func() error {
			_, err := middleware.NewTiered(m, middleware.Tiers{Plans: map[string][]middleware.Policy{
				"free": {{Limit: store.PerMinute(1)}}, "pro": {{Limit: store.PerMinute(2)}}}, Default: "free"})
			return err
		},
		"refund without Refunder": func() error {
			_, err := middleware.New(&countingStore{Store: m}, store.PerMinute(1), middleware.WithRefund(func(*http.Request, int) bool { return true }))
			return err
		},
	} {
		if err := f(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// An allow-listed key passes as a skip rule does: before its cost, which
// is neither asked for nor checked against a Burst.
func TestAllowListBeforeCost(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	var costs atomic.Int64
	opts := []middleware.Option{middleware.WithAllowList("user:admin"), middleware.WithKeyFunc(userKey),
		middleware.WithCost(func(*http.Request) int { costs.Add(1); return 5 })}
	l := mustNew(t, m, store.PerSecond(2), opts...)
	mp, err := middleware.NewMulti(m, []middleware.Policy{{Name: "a", Limit: store.PerSecond(10)}, {Name: "b", Limit: store.PerSecond(2)}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]http.Handler{"Limiter": l.Handler(okHandlerFunc), "Multi": mp.Handler(okHandlerFunc)} {
		for _, tc := range []struct {
			user string
			code int
		}{{"admin", 200}, {"ann", 400}} {
			costs.Store(0)
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set("X-User", tc.user)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if want := int64(0); tc.user == "admin" && costs.Load() != want || w.Code != tc.code {
				t.Errorf("%s, %s, cost 5 over a Burst of 2: %d, cost asked %d times; want %d", name, tc.user, w.Code, costs.Load(), tc.code)
			}
		}
	}
}

func TestAllowListParsing(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	for _, bad := range []string{"10.0.0.0/33", "192.168.1/24", " 10.0.0.1", "", "admin", "User:x", "::ffff:10.0.0.0/64", "user:"} {
		if _, err := middleware.New(m, store.PerMinute(1), middleware.WithAllowList(bad)); err == nil {
			t.Errorf("WithAllowList(%q): no error", bad)
		}
	}
	l := mustNew(t, m, store.PerMinute(1), middleware.WithAllowList("::ffff:10.0.0.0/104", "fe80::1%eth0", "route:GET /health"))
	h := l.Handler(okHandlerFunc)
	for _, remote := range []string{"10.9.9.9:1", "[::ffff:10.1.1.1]:1", "[fe80::1%eth0]:1"} {
		for range 3 {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = remote
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != 200 || w.Header().Get("RateLimit") != "" {
				t.Errorf("%s: %d, RateLimit %q; want allow-listed (200, no headers)", remote, w.Code, w.Header().Get("RateLimit"))
			}
		}
	}
}

// Behind a load balancer, the allow-list's networks match the client that
// the key function finds through the trusted proxies, not the balancer:
// an entry for the balancer's own network must not let every client
// through. The resolved address is matched whole, as the peer's is, however
// the key groups it (IPv6 by /64).
func TestAllowListBehindProxy(t *testing.T) {
	clientIP, err := keyfuncs.ClientIP(keyfuncs.TrustProxies("10.0.0.0/8"), keyfuncs.FromXForwardedFor())
	if err != nil {
		t.Fatal(err)
	}
	route := func(r *http.Request) (string, error) { return "route:" + r.URL.Path, nil }
	for _, kc := range []struct {
		name string
		fn   keyfuncs.KeyFunc
	}{
		{"ClientIP", clientIP},
		{"Join(ClientIP, route)", mustKey(keyfuncs.Join(clientIP, route))},
	} {
		cs := &multiCounting{Memory: store.NewMemory()}
		defer cs.Close()
		opts := []middleware.Option{middleware.WithAllowList("10.0.0.0/8", "2001:db8:1::/48", "2001:db8:9:9::5"),
			middleware.WithKeyFunc(kc.fn)}
		l := mustNew(t, cs, store.PerMinute(1), opts...)
		m, err := middleware.NewMulti(cs, []middleware.Policy{{Limit: store.PerMinute(1)}}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for name, h := range map[string]http.Handler{"Limiter": l.Handler(okHandlerFunc), "Multi": m.Handler(okHandlerFunc)} {
			for _, tc := range []struct {
				remote, xff string
				allowed     bool
			}{
				{"10.0.0.1:5000", "203.0.113.5", false},     // a client behind the balancer
				{"10.0.0.1:5000", "10.20.30.40", true},      // an internal client behind it
				{"10.0.0.1:5000", "2001:db8:1:2::5", true},  // its /64 is inside the /48
				{"10.0.0.1:5000", "2001:db8:9:9::5", true},  // matched whole, as a peer is
				{"10.0.0.1:5000", "2001:db8:9:9::6", false}, // its /64 neighbour is not
				{"10.9.9.9:5000", "", true},                 // the peer itself, no header
				{"192.0.2.7:5000", "10.20.30.40", false},    // an untrusted peer's header is ignored
				{"[2001:db8:9:9::5]:5000", "", true},        // the peer is the client: matched exactly
			} {
				name := fmt.Sprintf("%s/%s/%s via %s", kc.name, name, tc.xff, tc.remote)
				before := cs.n.Load()
				codes := make([]int, 2)
				for i := range codes {
					req := httptest.NewRequest(http.MethodGet, "/x", nil)
					req.RemoteAddr = tc.remote
					if tc.xff != "" {
						req.Header.Set("X-Forwarded-For", tc.xff)
					}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, req)
					codes[i] = w.Code
				}
				asked := cs.n.Load() > before
				switch {
				case tc.allowed && (asked || codes[1] != 200):
					t.Errorf("%s: codes %v, store asked %v; want allow-listed", name, codes, asked)
				case !tc.allowed && codes[1] != http.StatusTooManyRequests:
					t.Errorf("%s: codes %v, store asked %v; want limited (second request 429)", name, codes, asked)
				}
			}
		}
	}
}

// A nil KeyFunc is an error from the constructor, not a refused request
// later (keyfuncs constructors report bad arguments themselves).
func TestNewRefusesInvalidKeyFunc(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	if _, err := middleware.New(m, store.PerMinute(1), middleware.WithKeyFunc(nil)); err == nil {
		t.Error("New with WithKeyFunc(nil): no error")
	}
}

// A store made with an unusable option is refused, not run on a default.
func TestNewRefusesMisconfiguredStore(t *testing.T) {
	m := store.NewMemory(store.WithMaxKeys(0))
	defer m.Close()
	if _, err := middleware.New(m, store.PerMinute(1)); err == nil || !strings.Contains(err.Error(), "WithMaxKeys") {
		t.Errorf("New with a Memory store made WithMaxKeys(0): %v, want an error naming WithMaxKeys", err)
	}
}

// A subject that only looks like an address, from a key function that does
// not key by address (here a header the client writes), never allow-lists
// the request.
func TestAllowListIgnoresForgedSubject(t *testing.T) {
	tenant := func(r *http.Request) (string, error) {
		if v := r.Header.Get("X-Tenant"); v != "" {
			return v, nil
		}
		return "", keyfuncs.ErrNoKey
	}
	for _, kc := range []struct {
		name string
		fn   keyfuncs.KeyFunc
	}{{"tenant", tenant}, {"Join(tenant, PeerIP)", mustKey(keyfuncs.Join(tenant, keyfuncs.PeerIP))}} {
		cs := &multiCounting{Memory: store.NewMemory()}
		defer cs.Close()
		opts := []middleware.Option{middleware.WithAllowList("10.0.0.0/8"), middleware.WithKeyFunc(kc.fn)}
		l := mustNew(t, cs, store.PerMinute(1), opts...)
		m, err := middleware.NewMulti(cs, []middleware.Policy{{Limit: store.PerMinute(1)}}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		for name, h := range map[string]http.Handler{"Limiter": l.Handler(okHandlerFunc), "Multi": m.Handler(okHandlerFunc)} {
			var codes []int
			for range 3 {
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				req.RemoteAddr = "203.0.113.5:4000"
				req.Header.Set("X-Tenant", "ip:10.0.0.1")
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				codes = append(codes, w.Code)
			}
			if codes[2] != http.StatusTooManyRequests {
				t.Errorf("%s, %s: codes %v; want the forged subject limited (third request 429)", kc.name, name, codes)
			}
		}
	}
}

// An allow-listed peer passes without a key when no key function keys by
// address: the allow-list is read before the key function.
func TestAllowListedPeerNeedsNoKey(t *testing.T) {
	cs := &multiCounting{Memory: store.NewMemory()}
	defer cs.Close()
	opts := []middleware.Option{middleware.WithAllowList("10.0.0.0/8"), middleware.WithKeyFunc(userKey)}
	l := mustNew(t, cs, store.PerMinute(1), opts...)
	m, err := middleware.NewMulti(cs, []middleware.Policy{{Limit: store.PerMinute(1)}}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	for name, h := range map[string]http.Handler{"Limiter": l.Handler(okHandlerFunc), "Multi": m.Handler(okHandlerFunc)} {
		req := httptest.NewRequest(http.MethodGet, "/health", nil)
		req.RemoteAddr = "10.1.2.3:5000" // and no X-User
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Errorf("%s: %d, want 200", name, w.Code)
		}
	}
}

// FailClosed refuses with 503 and Retry-After 1 when the store fails;
// FailClosedWith chooses the status and Retry-After (0: none).
func TestFailClosedResponse(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	m := store.NewMemory()
	defer m.Close()
	for _, tc := range []struct {
		p      middleware.FailurePolicy
		status int
		retry  string
	}{
		{middleware.FailClosed, 503, "1"},
		{middleware.FailClosedWith(429, 5*time.Second), 429, "5"},
		{middleware.FailClosedWith(503, 0), 503, ""},
	} {
		l := mustNew(t, &failingStore{Store: m, fail: &fail}, store.PerSecond(10),
			middleware.WithFailurePolicy(tc.p), middleware.WithBreaker(0, 0))
		w := httptest.NewRecorder()
		l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != tc.status || w.Header().Get("Retry-After") != tc.retry {
			t.Errorf("%v: %d, Retry-After %q; want %d, %q", tc.p, w.Code, w.Header().Get("Retry-After"), tc.status, tc.retry)
		}
	}
}

// The deny cache keeps one bucket's denials: on a plan of several policies,
// asking for one is an error, not ignored; on a plan of one it works as on a
// Limiter.
func TestMultiDenyCache(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	two := []middleware.Policy{{Name: "a", Limit: store.PerMinute(1)}, {Name: "b", Limit: store.PerMinute(2)}}
	_, err := middleware.NewMulti(m, two, middleware.WithDenyCache(100))
	if err == nil || !strings.Contains(err.Error(), "WithDenyCache") {
		t.Errorf("NewMulti of two policies with WithDenyCache: %v, want an error naming WithDenyCache", err)
	}
	one, err := middleware.NewMulti(m, []middleware.Policy{{Name: "one", Limit: store.PerMinute(1)}}, middleware.WithDenyCache(100))
	if err != nil {
		t.Fatal(err)
	}
	h := one.Handler(okHandler)
	for i, want := range []int{200, 429, 429, 429} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != want {
			t.Errorf("request %d: %d, want %d", i, w.Code, want)
		}
	}
	if got := one.Stats().DenyCacheHits; got != 2 {
		t.Errorf("%d deny cache hits, want 2 (the store refused the second request)", got)
	}
}
