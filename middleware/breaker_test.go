package middleware_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
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

// flakyStore fails every Take while down is set, and counts the calls.
type flakyStore struct {
	store.Store
	down  atomic.Bool
	calls atomic.Int64
}

func (f *flakyStore) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	f.calls.Add(1)
	if f.down.Load() {
		return store.Result{}, errors.New("store down")
	}
	return f.Store.Take(ctx, key, lim, cost)
}

// timedStore is a store that is down and records when it was called.
type timedStore struct {
	mu    sync.Mutex
	calls []time.Time
}

func (s *timedStore) Take(context.Context, string, store.Limit, int) (store.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, time.Now())
	return store.Result{}, errors.New("store down")
}

// An open breaker probes 10 ms after it opened, then after twice the last
// wait each time, up to its cooldown: never sooner (what the test asserts
// exactly), and the first probe long before a cooldown, so that a short
// stall of Redis ends local decisions about when it ends.
func TestBreakerBacksOff(t *testing.T) {
	const cooldown = time.Second
	ts := &timedStore{}
	l := mustNew(t, ts, store.PerSecond(1000), middleware.WithBreaker(1, cooldown), quiet,
		middleware.WithFailurePolicy(middleware.FailOpen))
	h := l.Handler(okHandler)
	for start := time.Now(); time.Since(start) < 800*time.Millisecond; time.Sleep(time.Millisecond) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	ts.mu.Lock()
	calls := ts.calls
	ts.mu.Unlock()
	want := []time.Duration{10, 20, 40, 80, 160} // ms, after the call that opened it
	if len(calls) < len(want)+1 {
		t.Fatalf("%d store calls in 800 ms; want at least %d: the opening failure and probes at 10, 30, 70, 150, 310 ms", len(calls), len(want)+1)
	}
	for i, w := range want {
		if gap := calls[i+1].Sub(calls[i]); gap < w*time.Millisecond {
			t.Errorf("probe %d came %v after the last call; want %v or more", i+1, gap, w*time.Millisecond)
		}
	}
	if first := calls[1].Sub(calls[0]); first > 500*time.Millisecond {
		t.Errorf("first probe %v after the breaker opened; want it within a few waits of 10 ms", first)
	}
	if n := len(calls); n > 8 {
		t.Errorf("%d store calls in 800 ms; want at most 8: the waits double", n)
	}
}

func TestBreakerOpensProbesAndCloses(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	fs := &flakyStore{Store: m}
	var mu sync.Mutex
	var transitions []string
	var breakerErrs atomic.Int64
	var logged bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &logMu}, nil))
	logs := middleware.SlogObserver(logger)
	l := mustNew(t, fs, store.PerSecond(1000), middleware.WithBreaker(3, 100*time.Millisecond),
		middleware.WithObserver(middleware.ObserverFunc(func(e middleware.Event) {
			switch {
			case e.Kind == middleware.EventBreaker:
				logs.Observe(e)
				mu.Lock()
				transitions = append(transitions, e.From.String()+"->"+e.To.String())
				mu.Unlock()
			case e.Kind == middleware.EventError && errors.Is(e.Err, middleware.ErrBreakerOpen):
				breakerErrs.Add(1)
			}
		})))
	h := l.Handler(okHandler)
	serve := func() int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Code
	}
	fs.down.Store(true)
	for range 10 {
		if code := serve(); code != 200 {
			t.Fatalf("FailOpen while down: %d", code)
		}
	}
	if got := fs.calls.Load(); got != 3 {
		t.Errorf("store called %d times for 10 requests; want 3, then the breaker open", got)
	}
	if l.BreakerState() != middleware.BreakerOpen || breakerErrs.Load() != 7 {
		t.Errorf("state %v, %d ErrBreakerOpen; want open and 7", l.BreakerState(), breakerErrs.Load())
	}
	time.Sleep(120 * time.Millisecond)
	serve() // the probe: still down
	if got := fs.calls.Load(); got != 4 || l.BreakerState() != middleware.BreakerOpen {
		t.Errorf("after the cooldown: %d calls, state %v; want one probe (4) and open again", got, l.BreakerState())
	}
	fs.down.Store(false)
	time.Sleep(120 * time.Millisecond)
	serve() // the probe succeeds
	if l.BreakerState() != middleware.BreakerClosed {
		t.Errorf("after a successful probe: %v, want closed", l.BreakerState())
	}
	serve()
	if got := fs.calls.Load(); got != 6 {
		t.Errorf("closed again: %d calls, want 6", got)
	}
	logMu.Lock()
	if n := strings.Count(logged.String(), "tollgate breaker"); n != 5 ||
		!strings.Contains(logged.String(), "level=WARN msg=\"tollgate breaker\" limiter="+l.Name()+" event=breaker from=closed to=open") {
		t.Errorf("slog got %d transitions:\n%s", n, logged.String())
	}
	logMu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	want := []string{"closed->open", "open->half-open", "half-open->open", "open->half-open", "half-open->closed"}
	if len(transitions) != len(want) {
		t.Fatalf("transitions %v, want %v", transitions, want)
	}
	for i := range want {
		if transitions[i] != want[i] {
			t.Fatalf("transitions %v, want %v", transitions, want)
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestBreakerDisabled(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	fs := &flakyStore{Store: m}
	fs.down.Store(true)
	l := mustNew(t, fs, store.PerSecond(10), middleware.WithBreaker(0, 0))
	for range 10 {
		l.Handler(okHandler).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	if fs.calls.Load() != 10 {
		t.Errorf("without a breaker: %d calls, want 10", fs.calls.Load())
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(float64(len(s)-1)*p)]
}

// TestRedisHungFailOpen stops a real redis-server with SIGSTOP: every request
// is answered within the budget, the breaker makes the rest cheap, and
// limiting resumes after SIGCONT.
func TestRedisHungFailOpen(t *testing.T) {
	srv, rdb := stoppableRedis(t)
	const budget = 50 * time.Millisecond
	l := mustNew(t, store.NewRedis(rdb, store.WithKeyPrefix(t.Name()+":")), store.PerMinute(1000),
		middleware.WithTimeout(budget), middleware.WithBreaker(5, 500*time.Millisecond), quiet,
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("hung"))), middleware.WithFailurePolicy(middleware.FailOpen))
	h := l.Handler(okHandler)
	serve := func() (int, string, time.Duration) {
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Code, w.Header().Get("RateLimit"), time.Since(start)
	}
	if code, rl, _ := serve(); code != 200 || rl == "" {
		t.Fatalf("healthy: %d %q", code, rl)
	}

	srv.Pause()
	var lat []time.Duration
	for range 500 {
		code, rl, d := serve()
		if code != 200 || rl != "" {
			t.Fatalf("hung Redis, FailOpen: %d RateLimit %q; want 200 without headers", code, rl)
		}
		lat = append(lat, d)
	}
	p99, max := percentile(lat, 0.99), percentile(lat, 1)
	afterOpen := lat[10:] // the breaker opened after 5 failures; probes come every 500ms
	t.Logf("hung Redis, 500 requests: p50 %v, p99 %v, max %v; after the breaker opened: p50 %v",
		percentile(lat, 0.5), p99, max, percentile(afterOpen, 0.5))
	if max > budget+20*time.Millisecond {
		t.Errorf("slowest request %v; want within budget %v + 20ms", max, budget)
	}
	if p50 := percentile(afterOpen, 0.5); p50 > time.Millisecond {
		t.Errorf("with the breaker open, median latency %v; want under 1ms", p50)
	}
	if l.BreakerState() == middleware.BreakerClosed {
		t.Errorf("breaker closed while Redis hangs")
	}

	srv.Resume()
	resumed := time.Now()
	for {
		if _, rl, _ := serve(); rl != "" {
			break
		}
		if time.Since(resumed) > 2*time.Second {
			t.Fatalf("limiting did not resume within 2s of SIGCONT (breaker %v)", l.BreakerState())
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("limiting resumed %v after SIGCONT", time.Since(resumed).Round(time.Millisecond))
}

// TestRedisHungShortDeadlines: requests whose own deadline is shorter than
// the budget (http.TimeoutHandler, a router's timeout) open the breaker when
// a hung Redis lets it pass, so that later ones get the failure policy at
// once: a deadline that left the call a quarter of the budget or more is the
// store's failure. One that left less (had passed already, or a client's
// short one, on a healthy Redis too) is not, nor is a client that left; and
// a request whose own context ended is not answered (FailOpen does not serve
// it: a late request is no way past the limit).
func TestRedisHungShortDeadlines(t *testing.T) {
	srv, rdb := stoppableRedis(t)
	var served atomic.Int64
	newLimiter := func(name string) (*middleware.Limiter, http.Handler) {
		l := mustNew(t, store.NewRedis(rdb, store.WithKeyPrefix(t.Name()+name+":")), store.PerMinute(1000),
			middleware.WithTimeout(200*time.Millisecond), middleware.WithBreaker(5, time.Minute), quiet,
			middleware.WithKeyFunc(mustKey(keyfuncs.Static("hung"))), middleware.WithFailurePolicy(middleware.FailOpen))
		return l, l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1) }))
	}
	serve := func(h http.Handler, ctx context.Context) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	}
	late := func() (context.Context, context.CancelFunc) {
		return context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	}
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 20*time.Microsecond)
	}
	for _, tt := range []struct {
		name     string
		healthy  bool
		ctx      func() (context.Context, context.CancelFunc)
		served   int64 // -1: any
		breaker  middleware.BreakerState
		failures bool
	}{
		{"deadline within the budget", false, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 80*time.Millisecond)
		}, 7, middleware.BreakerOpen, true}, // 5 failures, then the open breaker's FailOpen
		{"late already", false, late, 0, middleware.BreakerClosed, false},
		{"short deadline", false, func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 5*time.Millisecond)
		}, 0, middleware.BreakerClosed, false},
		{"client left", false, func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
			return ctx, cancel
		}, 0, middleware.BreakerClosed, false},
		{"healthy, late already", true, late, 0, middleware.BreakerClosed, false},
		{"healthy, 20µs deadlines", true, short, -1, middleware.BreakerClosed, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv.Resume()
			l, h := newLimiter(tt.name)
			if !tt.healthy {
				srv.Pause()
			}
			served.Store(0)
			for range 12 {
				ctx, cancel := tt.ctx()
				serve(h, ctx)
				cancel()
			}
			if n := served.Load(); tt.served >= 0 && n != tt.served {
				t.Errorf("FailOpen served %d of 12; want %d", n, tt.served)
			}
			if s := l.BreakerState(); s != tt.breaker {
				t.Errorf("breaker %v; want %v", s, tt.breaker)
			}
			if n := l.Stats().StoreErrors; (n >= 5) != tt.failures {
				t.Errorf("StoreErrors %d; want at least 5: %v", n, tt.failures)
			}
		})
	}
	srv.Resume()
}

// TestFailLocalHoldsShare: with Redis hung, FailLocal holds each of 4
// instances (4 app servers) to its share of the limit, and together to the
// limit.
func TestFailLocalHoldsShare(t *testing.T) {
	addr := redistest.HangingAddr(t)
	lim := store.Limit{Rate: 40, Period: time.Minute, Burst: 40}
	total := 0
	for instance := range 4 {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		l := mustNew(t, store.NewRedis(rdb), lim, middleware.WithName("api"),
			middleware.WithFailurePolicy(middleware.FailLocalShare(4)),
			middleware.WithTimeout(20*time.Millisecond), quiet,
			middleware.WithKeyFunc(mustKey(keyfuncs.Static("everyone"))))
		h := l.Handler(okHandler)
		allowed, denied := 0, 0
		var last *httptest.ResponseRecorder
		for range 50 {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
			switch w.Code {
			case 200:
				allowed++
			case 429:
				denied++
				last = w
			default:
				t.Fatalf("instance %d: status %d", instance, w.Code)
			}
		}
		total += allowed
		if allowed != 10 || denied != 40 {
			t.Errorf("instance %d: allowed %d, denied %d; want 10 (40/4) and 40", instance, allowed, denied)
		}
		if got := last.Header().Get("RateLimit-Policy"); got != `"api";q=40;w=240` {
			t.Errorf("RateLimit-Policy during FailLocal %q; want the local share", got)
		}
		if got := last.Header().Get("Retry-After"); got != "6" {
			t.Errorf("Retry-After %q, want 6 (a token every 6s locally)", got)
		}
	}
	t.Logf("FailLocal, 4 instances, limit 40/min, Redis hanging: each allowed 10 of 50, together %d (limit 40)", total)
}

// A request costing more than a FailLocalShare's burst takes all of it, not
// none (it was served unlimited): limit 10/min burst 10 over 4 replicas is a
// local burst of 2, and a cost of 5 is allowed once, then refused.
func TestFailLocalShareCostOverShare(t *testing.T) {
	fs := &flakyStore{Store: &timedStore{}}
	fs.down.Store(true)
	for name, opts := range map[string][]middleware.Option{
		"Limiter": nil,
		"Multi":   {middleware.WithName("m")},
	} {
		opts = append(opts, middleware.WithFailurePolicy(middleware.FailLocalShare(4)), quiet,
			middleware.WithKeyFunc(mustKey(keyfuncs.Static("everyone"))), middleware.WithCost(func(*http.Request) int { return 5 }))
		var h http.Handler
		if name == "Limiter" {
			h = mustNew(t, fs, store.PerMinute(10), opts...).Handler(okHandler)
		} else {
			m, err := middleware.NewMulti(&multiFailing{}, []middleware.Policy{{Name: "a", Limit: store.PerMinute(10)}, {Name: "b", Limit: store.PerMinute(100)}}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			h = m.Handler(okHandler)
		}
		var codes []int
		var w *httptest.ResponseRecorder
		for range 4 {
			w = httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
			codes = append(codes, w.Code)
		}
		// All 5 tokens are owed, at the share's 10 per 4m: 2m (taking only the burst's 2, 48s,
		// served 5 tokens per 2 of the share: 2.5 times the limit over 4 servers).
		if !slices.Equal(codes, []int{200, 429, 429, 429}) || w.Header().Get("Retry-After") != "120" {
			t.Errorf("%s: cost 5 over a local burst of 2, store down: %v, Retry-After %s; want [200 429 429 429], 120",
				name, codes, w.Header().Get("Retry-After"))
		}
	}
}

// multiFailing is a MultiStore that is down.
type multiFailing struct{ timedStore }

func (*multiFailing) TakeAll(context.Context, []store.Request) ([]store.Result, error) {
	return nil, errors.New("store down")
}

// With default options, a stall of Redis longer than the budget does not
// open the gate: a flood during it gets at most the limit's own allowance
// on this server (a burst, then the rate), decided locally, and Redis
// decides again once it answers.
func TestRedisHungDefaultKeepsLimit(t *testing.T) {
	srv, rdb := stoppableRedis(t)
	lim := store.Limit{Rate: 20, Period: time.Second, Burst: 10}
	l := mustNew(t, store.NewRedis(rdb, store.WithKeyPrefix(t.Name()+":")), lim, quiet,
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("flood"))))
	h := l.Handler(okHandler)
	serve := func() int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Code
	}
	srv.Pause()
	paused := time.Now()
	allowed := 0
	for time.Since(paused) < 700*time.Millisecond {
		if serve() == 200 {
			allowed++
		}
	}
	stall := time.Since(paused)
	srv.Resume()
	if most := float64(lim.Burst) + float64(lim.Rate)*stall.Seconds() + 1; float64(allowed) > most {
		t.Errorf("Redis paused %v, default options: %d allowed; want at most %.0f (a burst and the rate, locally)", stall, allowed, most)
	}
	if allowed == 0 {
		t.Errorf("Redis paused, default options: nothing allowed; want the local limit to serve")
	}
	t.Logf("Redis paused %v under a flood, default options: %d allowed (limit 20/s, burst 10)", stall.Round(time.Millisecond), allowed)
}

// trickyStore fails, panics or hangs (ignoring its deadline) as told.
type trickyStore struct {
	store.Store
	mode atomic.Int32 // 0 healthy, 1 fail, 2 panic, 3 hang until the request ends
}

func (s *trickyStore) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	switch s.mode.Load() {
	case 1:
		return store.Result{}, errors.New("store down")
	case 2:
		panic("a store hook panics")
	case 3:
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond) // and answers late, past its deadline
		return store.Result{}, ctx.Err()
	}
	return s.Store.Take(ctx, key, lim, cost)
}

// The breaker always recovers: a probe that panics, whose client goes away,
// or that hangs past a cooldown does not leave it half-open, and a healthy
// store closes it at the next probe.
func TestBreakerAlwaysRecovers(t *testing.T) {
	const cooldown = 50 * time.Millisecond
	for _, probe := range []struct {
		name string
		mode int32
	}{{"panicking probe", 2}, {"abandoned probe", 3}} {
		t.Run(probe.name, func(t *testing.T) {
			m := store.NewMemory()
			defer m.Close()
			ts := &trickyStore{Store: m}
			l := mustNew(t, ts, store.PerSecond(1000), middleware.WithBreaker(2, cooldown), quiet,
				middleware.WithFailurePolicy(middleware.FailClosed), middleware.WithTimeout(time.Second))
			h := l.Handler(okHandler)
			serve := func(ctx context.Context) (code int) {
				defer func() {
					if recover() != nil {
						code = -1
					}
				}()
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
				return w.Code
			}
			ts.mode.Store(1)
			serve(context.Background())
			serve(context.Background())
			if l.BreakerState() != middleware.BreakerOpen {
				t.Fatalf("after 2 failures: %v, want open", l.BreakerState())
			}
			time.Sleep(cooldown + 10*time.Millisecond)
			ts.mode.Store(probe.mode)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			serve(ctx) // the probe: panics, or its client leaves
			cancel()
			if s := l.BreakerState(); s != middleware.BreakerOpen {
				t.Errorf("after the probe: %v, want open (the probe failed)", s)
			}
			ts.mode.Store(0)
			deadline := time.Now().Add(2 * time.Second)
			for l.BreakerState() != middleware.BreakerClosed && time.Now().Before(deadline) {
				serve(context.Background())
				time.Sleep(5 * time.Millisecond)
			}
			if s := l.BreakerState(); s != middleware.BreakerClosed {
				t.Errorf("healthy store for 2s: breaker %v, want closed", s)
			}
			if c := serve(context.Background()); c != 200 {
				t.Errorf("healthy store, breaker closed: %d, want 200", c)
			}
		})
	}
}

// A probe that never comes back (a store that ignores its deadline) does
// not keep the breaker half-open: after a cooldown another request probes.
func TestBreakerProbeThatHangs(t *testing.T) {
	const cooldown = 50 * time.Millisecond
	m := store.NewMemory()
	defer m.Close()
	hang := make(chan struct{})
	var hanging atomic.Bool
	fs := &flakyStore{Store: m}
	s := storeFunc(func(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
		if hanging.Load() {
			<-hang // ignores ctx
		}
		return fs.Take(ctx, key, lim, cost)
	})
	l := mustNew(t, s, store.PerSecond(1000), middleware.WithBreaker(1, cooldown), quiet,
		middleware.WithFailurePolicy(middleware.FailClosed))
	h := l.Handler(okHandler)
	serve := func() int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		return w.Code
	}
	fs.down.Store(true)
	serve() // opens
	time.Sleep(cooldown + 10*time.Millisecond)
	hanging.Store(true)
	done := make(chan struct{})
	go func() { defer close(done); serve() }() // the probe, stuck in the store
	time.Sleep(20 * time.Millisecond)
	if s := l.BreakerState(); s != middleware.BreakerHalfOpen {
		t.Fatalf("with the probe out: %v, want half-open", s)
	}
	hanging.Store(false)
	fs.down.Store(false)
	time.Sleep(cooldown + 10*time.Millisecond)
	if c := serve(); c != 200 || l.BreakerState() != middleware.BreakerClosed {
		t.Errorf("a cooldown after the stuck probe: %d, breaker %v; want 200 and closed", c, l.BreakerState())
	}
	close(hang)
	<-done
}

// storeFunc is a Store made of a function.
type storeFunc func(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error)

func (f storeFunc) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	return f(ctx, key, lim, cost)
}

// FailLocal's bucket follows what the server let through while the store
// answered: an outage does not hand a client that used its burst a fresh
// one, here or at the next outage.
func TestFailLocalNoFreshBurst(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	fs := &flakyStore{Store: m}
	l := mustNew(t, fs, store.PerMinute(5), middleware.WithBreaker(0, 0), quiet) // default: FailLocal
	h := l.Handler(okHandler)
	allowed := func(n int) int { return countAllowed(h, n) }
	if got := allowed(8); got != 5 {
		t.Fatalf("store healthy: %d of 8 allowed, want the burst of 5", got)
	}
	fs.down.Store(true)
	if got := allowed(8); got != 0 {
		t.Errorf("store down after the burst was used: %d allowed locally, want 0 (no fresh burst)", got)
	}
	fs.down.Store(false)
	fs.down.Store(true)
	if got := allowed(8); got != 0 {
		t.Errorf("second outage: %d allowed locally, want 0", got)
	}
}

// As a Limiter's, a Multi's local buckets follow what the server let
// through: an outage gives no fresh burst.
func TestFailLocalNoFreshBurstMulti(t *testing.T) {
	var fail atomic.Bool
	m := store.NewMemory()
	defer m.Close()
	multi, err := middleware.NewMulti(&failingMulti{Memory: m, fail: &fail},
		[]middleware.Policy{{Name: "p", Limit: store.PerMinute(5)}}, middleware.WithBreaker(0, 0), quiet)
	if err != nil {
		t.Fatal(err)
	}
	h := multi.Handler(okHandler)
	allowed := func(n int) int { return countAllowed(h, n) }
	if got := allowed(8); got != 5 {
		t.Fatalf("store healthy: %d of 8 allowed, want the burst of 5", got)
	}
	fail.Store(true)
	if got := allowed(8); got != 0 {
		t.Errorf("store down after the burst was used: %d allowed locally, want 0 (no fresh burst)", got)
	}
}

// failingMulti is a Memory store whose TakeAll fails while fail is set.
type failingMulti struct {
	*store.Memory
	fail *atomic.Bool
}

func (f *failingMulti) TakeAll(ctx context.Context, reqs []store.Request) ([]store.Result, error) {
	if f.fail.Load() {
		return nil, errors.New("store down")
	}
	return f.Memory.TakeAll(ctx, reqs)
}

// A Redis user whose ACL forbids the script is a configuration error: it is
// logged once per limiter, counted as "store_config", and the failure
// policy decides every request meanwhile.
func TestScriptRefusedReportedOnce(t *testing.T) {
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a redis-server of its own to add an ACL user to")
	}
	ctx := context.Background()
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "noeval", "reset", "on", ">pw", "~*", "+@all", "-evalsha", "-eval").Err(); err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "noeval", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	var logged bytes.Buffer
	var logMu sync.Mutex
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&lockedWriter{w: &logged, mu: &logMu}, nil)))
	t.Cleanup(func() { slog.SetDefault(old) })
	var kinds sync.Map
	l := mustNew(t, store.NewRedis(rdb), store.PerSecond(10), middleware.WithBreaker(0, 0),
		middleware.WithFailurePolicy(middleware.FailClosed),
		on(middleware.EventError, func(e middleware.Event) { kinds.Store(middleware.ErrorKind(e.Err), true) }))
	h := l.Handler(okHandler)
	for range 5 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code != 503 {
			t.Errorf("status %d, want 503 (FailClosed)", w.Code)
		}
	}
	logMu.Lock()
	defer logMu.Unlock()
	if n := strings.Count(logged.String(), "cannot run its script"); n != 1 {
		t.Errorf("logged %d times, want once:\n%s", n, logged.String())
	}
	if _, ok := kinds.Load("store_config"); !ok {
		t.Errorf("no EventError of kind store_config")
	}
}

// countAllowed sends n requests through h and counts the 200s.
func countAllowed(h http.Handler, n int) (ok int) {
	for range n {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code == 200 {
			ok++
		}
	}
	return ok
}

// stoppableRedis starts a redis-server of the test's own, which it can stop
// with SIGSTOP, and a client of it that gives up at the context's deadline.
func stoppableRedis(t *testing.T) (*redistest.Instance, *redis.Client) {
	t.Helper()
	srv := redistest.Server(t)
	if srv.External {
		t.Skip("needs a redis-server of its own to stop")
	}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 8})
	t.Cleanup(func() { rdb.Close() })
	return srv, rdb
}

// FailLocal's store is swept: its buckets, full again, are dropped without
// a sweeper goroutine of their own (a Limiter has no Close).
func TestFailLocalStoreIsSwept(t *testing.T) {
	defer middleware.SetLocalSweep(time.Millisecond)()
	down := storeFunc(func(context.Context, string, store.Limit, int) (store.Result, error) {
		return store.Result{}, errors.New("down")
	})
	l := mustNew(t, down, store.Limit{Rate: 100, Period: time.Second, Burst: 1}, middleware.WithBreaker(0, 0), quiet,
		middleware.WithKeyFunc(mustKey(keyfuncs.Header("X-Client"))))
	h := l.Handler(okHandler)
	serve := func(client string) int {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Header.Set("X-Client", client)
		h.ServeHTTP(w, r)
		return w.Code
	}
	for i := range 100 {
		if code := serve(strconv.Itoa(i)); code != http.StatusOK {
			t.Fatalf("client %d: %d, want 200 from the local bucket", i, code)
		}
	}
	if n := middleware.LocalLen(l); n == 0 {
		t.Fatalf("no local buckets after 100 clients")
	}
	// 10 ms after its request each bucket is full again; the next local
	// decision starts a sweep.
	deadline := time.Now().Add(5 * time.Second)
	for middleware.LocalLen(l) > 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d local buckets 5s after they were full; want them swept", middleware.LocalLen(l))
		}
		time.Sleep(20 * time.Millisecond)
		serve("sweeper")
	}
}

// A store call gets the request's values under a deadline of 15/16 of the
// budget to all of it, whenever the request comes; a request whose own
// deadline is sooner keeps its own.
func TestBudgetDeadline(t *testing.T) {
	type key struct{}
	const budget = 80 * time.Millisecond
	m := store.NewMemory()
	defer m.Close()
	var mu sync.Mutex
	var got []string
	check := func(ctx context.Context, want time.Duration) {
		d, ok := ctx.Deadline()
		left := time.Until(d)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !ok:
			got = append(got, "no deadline")
		case left > want || left < want-want/16-5*time.Millisecond: // 5 ms: this goroutine's lateness
			got = append(got, fmt.Sprintf("deadline in %v, want %v to %v", left, want-want/16, want))
		case ctx.Value(key{}) != "v":
			got = append(got, fmt.Sprintf("value %v, want v", ctx.Value(key{})))
		}
	}
	var want atomic.Int64
	st := storeFunc(func(ctx context.Context, k string, lim store.Limit, cost int) (store.Result, error) {
		check(ctx, time.Duration(want.Load()))
		return m.Take(ctx, k, lim, cost)
	})
	h := mustNew(t, st, store.PerSecond(1_000_000), middleware.WithTimeout(budget), quiet).Handler(okHandler)
	serve := func(ctx context.Context) {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(context.WithValue(ctx, key{}, "v")))
	}
	want.Store(int64(budget))
	for i := range 200 { // over two budgets and more
		serve(context.Background())
		time.Sleep(time.Duration(i%3) * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget/2)
	want.Store(int64(budget / 2))
	serve(ctx) // its own, sooner deadline
	cancel()
	mu.Lock()
	defer mu.Unlock()
	for _, msg := range slices.Compact(got) {
		t.Error(msg)
	}
}

// A probe the store answers closes the breaker even if its client left
// meanwhile: the store is healthy, whoever is still waiting.
func TestBreakerProbeAnsweredAfterClientLeft(t *testing.T) {
	const cooldown = 20 * time.Millisecond
	m := store.NewMemory()
	defer m.Close()
	var failing atomic.Bool
	var leave atomic.Pointer[context.CancelFunc]
	st := storeFunc(func(ctx context.Context, k string, lim store.Limit, cost int) (store.Result, error) {
		if failing.Load() {
			return store.Result{}, errors.New("store down")
		}
		if c := leave.Load(); c != nil {
			(*c)() // the client goes away while the store decides
		}
		return m.Take(ctx, k, lim, cost)
	})
	l := mustNew(t, st, store.PerSecond(1000), middleware.WithBreaker(2, cooldown), quiet)
	h := l.Handler(okHandler)
	failing.Store(true)
	for range 2 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	if s := l.BreakerState(); s != middleware.BreakerOpen {
		t.Fatalf("after 2 failures: %v, want open", s)
	}
	failing.Store(false)
	time.Sleep(2 * cooldown) // past the first probe's wait
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leave.Store(&cancel)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if s := l.BreakerState(); s != middleware.BreakerClosed {
		t.Errorf("after a probe the store answered, its client gone: %v, want closed", s)
	}
}
