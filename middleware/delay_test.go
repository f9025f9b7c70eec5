package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/internal/leaktest"
	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// delayStores runs f on a Memory store and on a real redis-server.
func delayStores(t *testing.T, f func(t *testing.T, s store.Store)) {
	t.Run("memory", func(t *testing.T) {
		m := store.NewMemory()
		t.Cleanup(func() { m.Close() })
		f(t, m)
	})
	t.Run("redis", func(t *testing.T) {
		f(t, store.NewRedis(redistest.Server(t).Client(t), store.WithKeyPrefix(t.Name()+":")))
	})
}

// 25 requests at once on 10/s burst 5 with WithDelay(1s): 5 are served at
// once, 10 wait for their tokens, spaced at the rate (never served before
// their time), and 10 are refused without waiting.
func TestDelaySpacesRequests(t *testing.T) {
	delayStores(t, func(t *testing.T, s store.Store) {
		lim := store.Limit{Rate: 10, Period: time.Second, Burst: 5}
		l := mustNew(t, s, lim, middleware.WithName("delay"), middleware.WithDelay(time.Second), quiet,
			middleware.WithKeyFunc(mustKey(keyfuncs.Static("one"))))
		h := l.Handler(okHandler)
		type answer struct {
			code      int
			took      time.Duration
			rateLimit string
		}
		answers := make([]answer, 25)
		start := time.Now()
		var wg sync.WaitGroup
		for i := range answers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
				answers[i] = answer{w.Code, time.Since(start), w.Header().Get("RateLimit")}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		var served, refused []time.Duration
		for _, a := range answers {
			switch a.code {
			case http.StatusOK:
				served = append(served, a.took)
			case http.StatusTooManyRequests:
				refused = append(refused, a.took)
			default:
				t.Fatalf("status %d", a.code)
			}
		}
		slices.Sort(served)
		slices.Sort(refused)
		// The arrivals may spread over a loaded machine's stalls, each 100 ms of
		// which refills a token: never fewer than 15 served, a few more at most.
		most := 15 + int(elapsed/(100*time.Millisecond)) - 10 // the waits themselves last 1 s
		if len(served) < 15 || len(served) > max(most, 15)+1 {
			t.Errorf("%d served, %d refused in %v; want 15 served (5 at once, 10 waiting), 10 refused", len(served), len(refused), elapsed)
		}
		// A token every 100 ms: the k-th waiting request is served no earlier
		// than k×100 ms (timers fire late, never early).
		for k, at := range served[5:] {
			if want := time.Duration(k+1) * 100 * time.Millisecond; at < want-2*time.Millisecond {
				t.Errorf("waiting request %d served at %v, before its tokens were due at %v", k+1, at, want)
			}
		}
		for _, at := range refused {
			if at >= time.Second {
				t.Errorf("a refusal took %v: it waited", at)
			}
		}
		var errs []time.Duration // how late each waiting request was served
		for k, at := range served[5:] {
			errs = append(errs, at-time.Duration(k+1)*100*time.Millisecond)
		}
		slices.Sort(errs)
		if len(errs) > 0 && len(refused) > 0 {
			t.Logf("served at %v; refusals within %v (p50 %v); waiting requests late by p50 %v, p99 %v",
				roundAll(served), refused[len(refused)-1].Round(time.Millisecond), refused[len(refused)/2].Round(time.Millisecond),
				errs[len(errs)/2].Round(time.Millisecond), errs[len(errs)*99/100].Round(time.Millisecond))
		}
		// The headers of a delayed response describe the bucket after it: no
		// token left, the next one within a second.
		for _, a := range answers {
			if a.code == http.StatusOK && a.took > 150*time.Millisecond && !strings.HasSuffix(a.rateLimit, ";r=0;t=1") {
				t.Errorf("a response served after %v: RateLimit %q, want r=0;t=1", a.took.Round(time.Millisecond), a.rateLimit)
			}
		}
	})
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}

// Over a longer run, waiting never lets more through than the limit:
// 64 goroutines for 1.5 s at 20/s burst 5 with WithDelay(500ms).
func TestDelayStaysWithinLimit(t *testing.T) {
	delayStores(t, func(t *testing.T, s store.Store) {
		lim := store.Limit{Rate: 20, Period: time.Second, Burst: 5}
		l := mustNew(t, s, lim, middleware.WithDelay(500*time.Millisecond), quiet,
			middleware.WithKeyFunc(mustKey(keyfuncs.Static("one"))))
		h := l.Handler(okHandler)
		var served atomic.Int64
		start := time.Now()
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Since(start) < 1500*time.Millisecond {
					w := httptest.NewRecorder()
					h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
					if w.Code == http.StatusOK {
						served.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		ideal := float64(lim.Burst) + float64(lim.Rate)*elapsed.Seconds()
		t.Logf("%d served in %v; Burst + Rate·T = %.1f", served.Load(), elapsed.Round(time.Millisecond), ideal)
		if float64(served.Load()) > ideal+1 {
			t.Errorf("%d served in %v; want at most Burst + Rate·T + 1 = %.1f", served.Load(), elapsed, ideal+1)
		}
	})
}

// queued counts the Takes a store queued (Delay > 0) once their answer is
// back, so that a test cancels waiters only once they wait: a client that
// leaves while its Take is in flight leaves its tokens taken (the store may
// or may not have taken them; refunding would risk giving back more).
type queued struct {
	store.Store
	n atomic.Int64
}

func (q *queued) TakeDelayed(ctx context.Context, key string, limit store.Limit, cost int, maxDelay time.Duration) (store.Result, error) {
	res, err := q.Store.(store.Delayer).TakeDelayed(ctx, key, limit, cost, maxDelay)
	if err == nil && res.Delay > 0 {
		q.n.Add(1)
	}
	return res, err
}

func (q *queued) Refund(ctx context.Context, key string, limit store.Limit, tokens int) (store.Result, error) {
	return q.Store.(store.Refunder).Refund(ctx, key, limit, tokens)
}

// 100 clients that give up while they wait get their tokens back, and
// their goroutines end at once.
func TestDelayCancelledWaitersGiveBack(t *testing.T) {
	leaktest.Check(t)
	delayStores(t, func(t *testing.T, inner store.Store) {
		s := &queued{Store: inner}
		lim := store.Limit{Rate: 1, Period: time.Second, Burst: 1} // each waiter takes 1 s of debt
		var abandoned atomic.Int64
		obs := on(middleware.EventAbandoned, func(e middleware.Event) {
			if e.Delay > 0 && e.Cost == 1 {
				abandoned.Add(1)
			}
		})
		l := mustNew(t, s, lim, middleware.WithName("cancel"), middleware.WithDelay(200*time.Second), obs,
			middleware.WithKeyFunc(mustKey(keyfuncs.Static("one"))))
		h := l.Handler(okHandler)
		firstAt := time.Now() // at most the first Take's instant
		first := httptest.NewRecorder()
		h.ServeHTTP(first, httptest.NewRequest(http.MethodGet, "/", nil))
		if first.Code != http.StatusOK {
			t.Fatalf("first request: %d", first.Code)
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		var codes sync.Map
		for i := range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w := httptest.NewRecorder()
				h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
				codes.Store(i, w.Code)
			}()
		}
		// Every one has its answer: queued, each 1 s more (the first's 1 s,
		// then 100); then a moment for the last to reach its wait.
		for deadline := time.Now().Add(30 * time.Second); s.n.Load() < 100; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("only %d of the waiters were queued", s.n.Load())
			}
		}
		time.Sleep(100 * time.Millisecond)
		if r, err := s.Take(context.Background(), "cancel:one", lim, 0); err != nil || r.ResetAfter+time.Since(firstAt) < 100500*time.Millisecond {
			t.Fatalf("the bucket after 100 waiters queued: %+v, %v; want 101 s of debt", r, err)
		}
		cancelled := time.Now()
		cancel()
		wg.Wait()
		took := time.Since(cancelled)
		r, err := s.Take(context.Background(), "cancel:one", lim, 0)
		t.Logf("100 waiters gave up: all returned within %v; the bucket then: %+v", took.Round(time.Millisecond), r)
		if err != nil || r.ResetAfter > time.Second {
			t.Errorf("after 100 waiters gave up the bucket is full in %v (%v); want their tokens back (at most the first's 1 s)", r.ResetAfter, err)
		}
		if took > 5*time.Second {
			t.Errorf("the waiters took %v to return after their clients left", took)
		}
		if n := abandoned.Load(); n != 100 {
			t.Errorf("%d EventAbandoned with their delay, want 100", n)
		}
		codes.Range(func(k, v any) bool {
			if v.(int) != http.StatusOK { // the recorder's default: nothing written
				t.Errorf("waiter %v: %d written to a client that left", k, v)
			}
			return true
		})
	})
}

// A Multi waits for the longest Delay over its policies.
func TestDelayMulti(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	type seen struct {
		policy        string
		waited, delay time.Duration // the request's wait, the policy's own Delay
	}
	var events []seen
	var mu sync.Mutex
	obs := on(middleware.EventAllowed, func(e middleware.Event) {
		mu.Lock()
		events = append(events, seen{e.Limiter, e.Delay, e.Result.Delay})
		mu.Unlock()
	})
	multi, err := middleware.NewMulti(m, []middleware.Policy{
		{Name: "fast", Limit: store.Limit{Rate: 100, Period: time.Second, Burst: 1}},
		{Name: "slow", Limit: store.Limit{Rate: 10, Period: time.Second, Burst: 1}},
	}, middleware.WithDelay(250*time.Millisecond), middleware.WithKeyFunc(mustKey(keyfuncs.Static("u"))), obs)
	if err != nil {
		t.Fatal(err)
	}
	h := multi.Handler(okHandler)
	start := time.Now()
	var codes []int
	for range 4 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		codes = append(codes, w.Code)
	}
	took := time.Since(start)
	// One after another, each request after the first waits for the slow
	// policy's next token (100 ms; the fast one's, 10 ms, is shorter).
	if !slices.Equal(codes, []int{200, 200, 200, 200}) || took < 295*time.Millisecond {
		t.Errorf("codes %v in %v; want four served, spaced by the slow policy (≥ 300 ms)", codes, took)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range events {
		if (e.policy == "slow" && e.waited != e.delay) || e.waited < e.delay || e.waited > 100*time.Millisecond {
			t.Errorf("%s: waited %v, its own Delay %v; want the slow policy's, the longest", e.policy, e.waited, e.delay)
		}
	}
}

// In dry-run mode the wait is reported, not applied; a store failure never
// makes a request wait (the fallback decides at once).
func TestDelayDryRunAndFailure(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	var reported atomic.Int64
	obs := on(middleware.EventAllowed, func(e middleware.Event) {
		if e.Delay > 0 {
			reported.Add(1)
		}
	})
	lim := store.Limit{Rate: 1, Period: time.Second, Burst: 1}
	dry := mustNew(t, m, lim, middleware.WithDelay(10*time.Second), middleware.WithDryRun(true), obs,
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("dry"))))
	start := time.Now()
	for range 3 {
		dry.Handler(okHandler).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}
	if took := time.Since(start); took > 900*time.Millisecond || reported.Load() != 2 {
		t.Errorf("dry run: 3 requests in %v, %d delays reported; want no waiting and 2 delays reported", took, reported.Load())
	}

	down := storeFunc(func(context.Context, string, store.Limit, int) (store.Result, error) {
		return store.Result{}, errors.New("down")
	})
	if _, err := middleware.New(down, lim, middleware.WithDelay(time.Second)); err == nil {
		t.Errorf("WithDelay on a store that cannot take ahead: no error")
	}
	failing := &flakyDelayer{Memory: m}
	failing.down.Store(true)
	l := mustNew(t, failing, lim, middleware.WithDelay(10*time.Second), quiet, middleware.WithBreaker(0, 0),
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("down"))))
	start = time.Now()
	var codes []int
	for range 3 {
		w := httptest.NewRecorder()
		l.Handler(okHandler).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		codes = append(codes, w.Code)
	}
	if took := time.Since(start); took > 900*time.Millisecond || !slices.Equal(codes, []int{200, 429, 429}) {
		t.Errorf("store down: %v in %v; want the local bucket's 200, 429, 429 at once", codes, took)
	}
	if _, err := middleware.New(m, lim, middleware.WithDelay(-time.Second)); err == nil {
		t.Errorf("WithDelay(-1s): no error")
	}
}

// flakyDelayer is a Memory store whose TakeDelayed fails while down is set.
type flakyDelayer struct {
	*store.Memory
	down atomic.Bool
}

func (f *flakyDelayer) TakeDelayed(ctx context.Context, key string, lim store.Limit, cost int, maxDelay time.Duration) (store.Result, error) {
	if f.down.Load() {
		return store.Result{}, errors.New("down")
	}
	return f.Memory.TakeDelayed(ctx, key, lim, cost, maxDelay)
}

// A request whose deadline comes before its tokens is refused at once, its
// tokens given back, with the time they would have been due.
func TestDelayDeadlineFirst(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim := store.Limit{Rate: 1, Period: time.Second, Burst: 1}
	l := mustNew(t, m, lim, middleware.WithName("late"), middleware.WithDelay(2*time.Second), quiet,
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("one"))))
	h := l.Handler(okHandler)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	ctx, cancel := context.WithTimeout(context.Background(), 800*time.Millisecond)
	defer cancel()
	w := httptest.NewRecorder()
	start := time.Now()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
	took := time.Since(start)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "1" || took > 700*time.Millisecond { // a refusal that waited would take the whole deadline
		t.Errorf("a deadline 800 ms away, tokens due in 1 s: %d, Retry-After %q after %v; want 429, 1, at once", w.Code, w.Header().Get("Retry-After"), took)
	}
	if r, err := m.Take(context.Background(), "late:one", lim, 0); err != nil || r.ResetAfter > time.Second {
		t.Errorf("after the refusal the bucket is full in %v (%v); want the second request's token back", r.ResetAfter, err)
	}
}

// FailLocal's buckets follow what the store allowed, once each, with
// WithDelay as without: when the store fails they hold what is left.
func TestDelayFailLocalMirror(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	fs := &flakyDelayer{Memory: m}
	lim := store.Limit{Rate: 1, Period: time.Hour, Burst: 10}
	l := mustNew(t, fs, lim, middleware.WithDelay(time.Second), quiet, middleware.WithBreaker(0, 0),
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("mirror"))))
	h := l.Handler(okHandler)
	count := func(n int) (ok int) {
		for range n {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
			if w.Code == http.StatusOK {
				ok++
			}
		}
		return ok
	}
	if got := count(5); got != 5 {
		t.Fatalf("store up: %d of 5 allowed", got)
	}
	fs.down.Store(true)
	if got := count(10); got != 5 {
		t.Errorf("store down after 5 of a burst of 10: %d of 10 allowed locally, want the 5 left", got)
	}
}
