package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/headers"
	"github.com/tollgate-go/tollgate/internal/leaktest"
	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// fakeTime is one controlled clock for a Memory store (WithClock) and a
// limiter's deny cache (SetDenyCacheClock), so that the two agree exactly.
type fakeTime struct {
	mu sync.Mutex
	d  time.Duration
}

func (f *fakeTime) now() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.d
}

func (f *fakeTime) wall() time.Time { return time.Unix(1_700_000_000, 0).Add(f.now()) }

func (f *fakeTime) add(d time.Duration) {
	f.mu.Lock()
	f.d += d
	f.mu.Unlock()
}

// costHeader makes a request's cost what its X-Cost header says (default 1).
func costHeader(r *http.Request) int {
	if c, err := strconv.Atoi(r.Header.Get("X-Cost")); err == nil {
		return c
	}
	return 1
}

// serveCost serves one request of cost through h.
func serveCost(h http.Handler, cost int) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-Cost", strconv.Itoa(cost))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// newFakeTimeLimiter returns a limiter with a deny cache of 100 keys on a
// Memory store behind a countingStore, all on ft.
func newFakeTimeLimiter(t *testing.T, ft *fakeTime, lim store.Limit, opts ...middleware.Option) (*middleware.Limiter, *countingStore) {
	t.Helper()
	cs := &countingStore{Store: store.NewMemory(store.WithClock(ft.wall), store.WithSweepInterval(0))}
	l := mustNew(t, cs, lim, append([]middleware.Option{middleware.WithName("api"), middleware.WithDenyCache(100),
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("client"))), middleware.WithCost(costHeader)}, opts...)...)
	middleware.SetDenyCacheClock(l, ft.now)
	return l, cs
}

func TestDenyCacheValidates(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	if l, err := middleware.New(m, store.PerSecond(1), middleware.WithDenyCache(-1)); err == nil || l != nil {
		t.Errorf("WithDenyCache(-1): %v, %v; want an error", l, err)
	}
	l := mustNew(t, m, store.PerMinute(1), middleware.WithDenyCache(0), middleware.WithKeyFunc(mustKey(keyfuncs.Static(t.Name()))))
	for range 3 {
		l.Handler(okHandler).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	if l.Stats().DenyCacheHits != 0 {
		t.Errorf("WithDenyCache(0): %d hits; want the cache off", l.Stats().DenyCacheHits)
	}
}

// TestDenyCacheHeadersAsStore drives two limiters, one with the cache and
// one without, each on its own Memory store, through the same requests on
// the same clock: every response, locally refused or not, is the same,
// header for header, hook for hook, and the cache saves the store calls.
func TestDenyCacheHeadersAsStore(t *testing.T) {
	ft := &fakeTime{}
	lim := store.Limit{Rate: 100, Period: time.Second, Burst: 10} // a token every 10ms
	var deniedHooks [2]atomic.Int64
	var handlerCalls [2]atomic.Int64
	hook := func(i int) middleware.Option {
		return on(middleware.EventDenied, func(e middleware.Event) {
			if e.Key != "client" || e.Cost < 1 || e.Result.Allowed || e.DryRun {
				t.Errorf("limiter %d: denied event %+v", i, e)
			}
			deniedHooks[i].Add(1)
		})
	}
	handler := func(i int) middleware.Option {
		return middleware.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res store.Result) {
			handlerCalls[i].Add(1)
			w.WriteHeader(http.StatusTooManyRequests)
		})
	}
	cached, cs := newFakeTimeLimiter(t, ft, lim, hook(0), handler(0))
	plain := mustNew(t, store.NewMemory(store.WithClock(ft.wall), store.WithSweepInterval(0)), lim,
		middleware.WithName("api"), middleware.WithKeyFunc(mustKey(keyfuncs.Static("client"))), middleware.WithCost(costHeader), hook(1), handler(1))
	hc, hp := cached.Handler(okHandler), plain.Handler(okHandler)

	type step struct {
		advance time.Duration
		cost    int
	}
	var steps []step
	for range 12 { // the burst, then denials
		steps = append(steps, step{0, 1})
	}
	steps = append(steps,
		step{3 * time.Millisecond, 1}, step{4 * time.Millisecond, 1}, step{2*time.Millisecond + 999*time.Microsecond, 1},
		step{time.Microsecond, 1}, // the retry time: the probe, allowed
		step{0, 1}, step{0, 2}, step{5 * time.Millisecond, 1},
		step{5 * time.Millisecond, 3}, // the retry time: a probe of cost 3, denied
		step{9 * time.Millisecond, 3}, step{0, 2}, step{0, 5},
		step{100 * time.Millisecond, 5}, step{0, 5}, step{0, 1}, step{time.Millisecond, 4},
		step{time.Second, 10}, step{0, 10}, step{500 * time.Millisecond, 10},
	)
	for i, s := range steps {
		ft.add(s.advance)
		wc, wp := serveCost(hc, s.cost), serveCost(hp, s.cost)
		if wc.Code != wp.Code || !equalHeader(wc.Header(), wp.Header()) {
			t.Errorf("step %d (+%v, cost %d): with the cache %d %q; without %d %q",
				i, s.advance, s.cost, wc.Code, fields(wc.Header()), wp.Code, fields(wp.Header()))
		}
	}
	hits := cached.Stats().DenyCacheHits
	if hits == 0 || cs.n.Load()+hits != int64(len(steps)) {
		t.Errorf("%d store calls and %d local refusals for %d requests; want some local ones, and together all",
			cs.n.Load(), hits, len(steps))
	}
	if deniedHooks[0].Load() != deniedHooks[1].Load() || handlerCalls[0].Load() != handlerCalls[1].Load() {
		t.Errorf("denied hooks %d and %d, denied handler %d and %d; want the same with and without the cache",
			deniedHooks[0].Load(), deniedHooks[1].Load(), handlerCalls[0].Load(), handlerCalls[1].Load())
	}
	t.Logf("%d requests: %d refused locally, %d store calls", len(steps), hits, cs.n.Load())
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w := b[k]
		if len(v) != len(w) {
			return false
		}
		for i := range v {
			if v[i] != w[i] {
				return false
			}
		}
	}
	return true
}

func fields(h http.Header) []string {
	var out []string
	for _, k := range []string{"Ratelimit-Policy", "Ratelimit", "Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset", "Retry-After"} {
		out = append(out, k+": "+h.Get(k))
	}
	return out
}

// TestDenyCacheExpiresAtRetryTime: the entry refuses until the instant the
// store gave, and not one nanosecond longer.
func TestDenyCacheExpiresAtRetryTime(t *testing.T) {
	ft := &fakeTime{}
	l, cs := newFakeTimeLimiter(t, ft, store.Limit{Rate: 1, Period: time.Second, Burst: 1})
	h := l.Handler(okHandler)
	if w := serveCost(h, 1); w.Code != 200 {
		t.Fatalf("first request: %d", w.Code)
	}
	ft.add(250 * time.Millisecond)
	if w := serveCost(h, 1); w.Code != 429 || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("second request: %d, Retry-After %q; want 429 from the store, 1", w.Code, w.Header().Get("Retry-After"))
	}
	ft.add(750*time.Millisecond - 1) // 1ns before the retry time
	w := serveCost(h, 1)
	if w.Code != 429 || cs.n.Load() != 2 {
		t.Fatalf("1ns before the retry time: %d after %d store calls; want 429 from the cache, 2 calls", w.Code, cs.n.Load())
	}
	if got, want := w.Header().Get("Retry-After"), "1"; got != want {
		t.Errorf("Retry-After of 1ns: %q, want %q (at least 1)", got, want)
	}
	if got, want := w.Header().Get("RateLimit"), `"api";r=0;t=1`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	ft.add(1)
	if w := serveCost(h, 1); w.Code != 200 || cs.n.Load() != 3 {
		t.Errorf("at the retry time: %d after %d store calls; want 200 from the store (3 calls)", w.Code, cs.n.Load())
	}
	// The probe took the only token: its answer (reset in 1s) says the next
	// one is due in 1s, so the entry is renewed until then (less the
	// microsecond of rounding), without asking the store.
	if n := middleware.DenyCacheLen(l); n != 1 {
		t.Errorf("%d entries after an allowed probe that emptied the bucket, want 1", n)
	}
	ft.add(time.Second - 2*time.Microsecond)
	if w := serveCost(h, 1); w.Code != 429 || cs.n.Load() != 3 {
		t.Errorf("just before the next token: %d after %d store calls; want 429 from the cache (3 calls)", w.Code, cs.n.Load())
	}
	ft.add(2 * time.Microsecond)
	if w := serveCost(h, 1); w.Code != 200 || cs.n.Load() != 4 {
		t.Errorf("at the next token: %d after %d store calls; want 200 from the store (4 calls)", w.Code, cs.n.Load())
	}
}

// TestDenyCacheLowerCostReachesStore: a cached denial of cost 5 refuses
// costs of 5 and more, not a cost of 1, which the store allows.
func TestDenyCacheLowerCostReachesStore(t *testing.T) {
	ft := &fakeTime{}
	l, cs := newFakeTimeLimiter(t, ft, store.Limit{Rate: 10, Period: time.Minute, Burst: 10})
	h := l.Handler(okHandler)
	for i, step := range []struct {
		cost, code int
		calls      int64
	}{
		{4, 200, 1}, {4, 200, 2}, // 2 tokens left
		{5, 429, 3},              // denied by the store: cached for cost >= 5
		{5, 429, 3}, {7, 429, 3}, // refused locally
		{1, 200, 4}, // a lower cost reaches the store and passes
		{1, 200, 5},
		{1, 429, 6}, // now cached for cost >= 1
		{1, 429, 6}, {5, 429, 6},
		{0, 200, 7}, // a read always reaches the store
	} {
		w := serveCost(h, step.cost)
		if w.Code != step.code || cs.n.Load() != step.calls {
			t.Errorf("step %d, cost %d: %d after %d store calls; want %d after %d", i, step.cost, w.Code, cs.n.Load(), step.code, step.calls)
		}
	}
}

// TestDenyCacheCostZeroNeverCached: reads are never refused locally and
// never recorded.
func TestDenyCacheCostZeroNeverCached(t *testing.T) {
	ft := &fakeTime{}
	l, cs := newFakeTimeLimiter(t, ft, store.Limit{Rate: 1, Period: time.Minute, Burst: 1})
	h := l.Handler(okHandler)
	serveCost(h, 1)
	for i := range 5 {
		if w := serveCost(h, 0); w.Code != 200 || w.Header().Get("RateLimit") != `"api";r=0;t=60` {
			t.Errorf("read %d: %d %q", i, w.Code, w.Header().Get("RateLimit"))
		}
	}
	if cs.n.Load() != 6 || middleware.DenyCacheLen(l) != 0 {
		t.Errorf("%d store calls, %d entries; want 6 and none", cs.n.Load(), middleware.DenyCacheLen(l))
	}
}

// gateStore holds the Takes of a test while hold is set, reporting each on
// entered, and lets them go on the release channel.
type gateStore struct {
	store.Store
	hold    atomic.Bool
	fail    atomic.Bool
	entered chan struct{}
	release chan struct{}
	calls   atomic.Int64
}

func (g *gateStore) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	g.calls.Add(1)
	if g.hold.Load() {
		g.entered <- struct{}{}
		<-g.release
	}
	if g.fail.Load() {
		return store.Result{}, errors.New("store down")
	}
	return g.Store.Take(ctx, key, lim, cost)
}

// TestDenyCacheSingleProbe: when the entry's time has come, one request
// goes to the store; while it is out, the others are refused until the
// next tokens are due, then they go to the store too; the probe's answer
// then renews or drops the entry.
func TestDenyCacheSingleProbe(t *testing.T) {
	lim := store.Limit{Rate: 10, Period: time.Second, Burst: 1} // a token every 100ms
	for _, tc := range []struct {
		name       string
		fail       bool // the probe fails
		takeFirst  bool // another request takes the token before the probe reaches the store
		wantProbe  int
		wantCached bool // the entry is there after the probe
	}{
		// Allowed, leaving fewer tokens than its cost: the answer says when
		// the next cost is there, and the entry is renewed until then.
		{name: "probe allowed", wantProbe: 200, wantCached: true},
		{name: "probe denied", takeFirst: true, wantProbe: 429, wantCached: true},
		{name: "probe failed", fail: true, wantProbe: 200 /* FailOpen */, wantCached: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeTime{}
			gs := &gateStore{Store: store.NewMemory(store.WithClock(ft.wall), store.WithSweepInterval(0)),
				entered: make(chan struct{}), release: make(chan struct{})}
			l := mustNew(t, gs, lim, middleware.WithName("api"), middleware.WithDenyCache(10),
				middleware.WithKeyFunc(mustKey(keyfuncs.Static("client"))), middleware.WithBreaker(0, 0), quiet,
				middleware.WithFailurePolicy(middleware.FailOpen))
			middleware.SetDenyCacheClock(l, ft.now)
			h := l.Handler(okHandler)
			serveCost(h, 1)
			if w := serveCost(h, 1); w.Code != 429 || gs.calls.Load() != 2 {
				t.Fatalf("second request: %d; want a denial by the store", w.Code)
			}
			ft.add(100 * time.Millisecond) // the retry time
			gs.hold.Store(true)
			gs.fail.Store(tc.fail)
			probe := make(chan int)
			go func() { probe <- serveCost(h, 1).Code }()
			<-gs.entered // the probe is at the store
			gs.hold.Store(false)
			gs.fail.Store(false)

			ft.add(50 * time.Millisecond)
			w := serveCost(h, 1)
			if w.Code != 429 || gs.calls.Load() != 3 {
				t.Errorf("probe out, +50ms: %d after %d store calls; want a local 429 (3 calls)", w.Code, gs.calls.Load())
			}
			if got := w.Header().Get("Retry-After"); got != "1" {
				t.Errorf("probe out, +50ms: Retry-After %q, want 1", got)
			}
			if tc.takeFirst {
				ft.add(50 * time.Millisecond) // the next token is due: requests go to the store
				if w := serveCost(h, 1); w.Code != 200 || gs.calls.Load() != 4 {
					t.Errorf("probe out, +100ms: %d after %d store calls; want 200 from the store (4 calls)", w.Code, gs.calls.Load())
				}
			}
			gs.fail.Store(tc.fail)
			gs.release <- struct{}{}
			if code := <-probe; code != tc.wantProbe {
				t.Errorf("probe: %d, want %d", code, tc.wantProbe)
			}
			gs.fail.Store(false)
			calls := gs.calls.Load()
			serveCost(h, 1)
			if cached := gs.calls.Load() == calls; cached != tc.wantCached {
				t.Errorf("after the probe: refused locally %v, want %v", cached, tc.wantCached)
			}
		})
	}
}

// TestDenyCacheBounded: 100,000 distinct keys denied, the cache never holds
// more than its maxKeys.
func TestDenyCacheBounded(t *testing.T) {
	const maxKeys = 1000
	lim := store.PerMinute(1)
	var i int
	l := mustNew(t, denyAll{}, lim, middleware.WithDenyCache(maxKeys), middleware.WithHeaders(0), middleware.WithBreaker(0, 0),
		middleware.WithKeyFunc(func(*http.Request) (string, error) { return "k" + strconv.Itoa(i), nil }))
	h := l.Handler(okHandler)
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	w := &benchWriter{h: http.Header{}}
	most := 0
	for i = range 100_000 {
		clear(w.h)
		h.ServeHTTP(w, r)
		if i%100 == 0 {
			most = max(most, middleware.DenyCacheLen(l))
		}
	}
	n := middleware.DenyCacheLen(l)
	if most = max(most, n); most > maxKeys || n < maxKeys/2 {
		t.Errorf("after 100,000 denied keys: %d entries, at most %d; want at most %d, and at least half as many", n, most, maxKeys)
	}
	// The last keys are still refused locally.
	hits := l.Stats().DenyCacheHits
	h.ServeHTTP(w, r)
	if l.Stats().DenyCacheHits != hits+1 {
		t.Errorf("the last key denied is not refused locally")
	}
	t.Logf("100,000 denied keys, maxKeys %d: %d entries (at most %d seen)", maxKeys, n, most)
}

// denyAll denies everything for a minute.
type denyAll struct{}

func (denyAll) Take(_ context.Context, _ string, lim store.Limit, _ int) (store.Result, error) {
	return store.Result{Limit: lim, RetryAfter: time.Minute, ResetAfter: time.Minute}, nil
}

func TestDenyCacheDryRunDoesNotCache(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	cs := &countingStore{Store: m}
	l := mustNew(t, cs, store.PerMinute(1), middleware.WithDryRun(true), middleware.WithDenyCache(10))
	for range 5 {
		if w := serveCost(l.Handler(okHandler), 1); w.Code != 200 {
			t.Fatalf("dry run: %d", w.Code)
		}
	}
	if cs.n.Load() != 5 || l.Stats().DenyCacheHits != 0 {
		t.Errorf("dry run: %d store calls, %d local refusals; want 5 and 0", cs.n.Load(), l.Stats().DenyCacheHits)
	}
}

// floodLimit is the limit of the flood tests: 100 a second, burst 10.
var floodLimit = store.Limit{Rate: 100, Period: time.Second, Burst: 10}

type floodResult struct {
	allowed, denied int
	takes           int64 // store calls
	local           int64 // refused by the deny cache
	elapsed         time.Duration
	// stalled is the time the flood sent nothing for longer than a full
	// bucket lasts (Burst/Rate): the tokens refilled then overflowed, on
	// any limiter, so a loaded machine lowers what can be allowed.
	stalled time.Duration
}

// ideal is how many requests a perfect limiter allows in r's flood.
func (r floodResult) ideal() float64 {
	return float64(floodLimit.Burst) + float64(floodLimit.Rate)*r.elapsed.Seconds()
}

// lost is how many of the ideal's tokens overflowed while the flood stalled.
func (r floodResult) lost() float64 { return float64(floodLimit.Rate) * r.stalled.Seconds() }

// flood sends 2,000 requests on one key, evenly over one second, through a
// limiter named name on st (with opts) and counts the outcomes and the
// store calls. With the deny cache, it also checks the headers of one
// local refusal against what the store says right after.
func flood(t *testing.T, st store.Store, name string, opts ...middleware.Option) floodResult {
	t.Helper()
	cs := &countingStore{Store: st}
	l := mustNew(t, cs, floodLimit, append([]middleware.Option{middleware.WithName(name),
		middleware.WithKeyFunc(mustKey(keyfuncs.Static("flood"))), quiet}, opts...)...)
	h := l.Handler(okHandler)
	var res floodResult
	checked := false
	start := time.Now()
	full := time.Duration(floodLimit.Burst) * floodLimit.Period / time.Duration(floodLimit.Rate)
	last := start
	for i := range 2000 {
		if d := time.Until(start.Add(time.Duration(i) * 500 * time.Microsecond)); d > 0 {
			time.Sleep(d)
		}
		now := time.Now()
		res.stalled += max(now.Sub(last)-full, 0)
		last = now
		before := cs.n.Load()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		switch w.Code {
		case http.StatusOK:
			res.allowed++
		case http.StatusTooManyRequests:
			res.denied++
			if !checked && i > 1000 && cs.n.Load() == before {
				checked = true
				checkLocalRefusal(t, st, name, w.Header())
			}
		default:
			t.Fatalf("request %d: status %d", i, w.Code)
		}
	}
	res.elapsed = time.Since(start)
	res.takes, res.local = cs.n.Load(), l.Stats().DenyCacheHits
	return res
}

// checkLocalRefusal compares the headers of a local refusal with what the
// store says about the bucket right after (a read, cost 0).
func checkLocalRefusal(t *testing.T, st store.Store, name string, hdr http.Header) {
	t.Helper()
	sr, err := st.Take(context.Background(), name+":flood", floodLimit, 0)
	if err != nil {
		t.Fatal(err)
	}
	storeT := headers.Seconds(middleware.NextToken(sr))
	retry, err := strconv.Atoi(hdr.Get("Retry-After"))
	if err != nil || retry < 1 || int64(retry) > storeT+1 {
		t.Errorf("local refusal: Retry-After %q; want at least 1, within 1s of the store's next token (t=%d)", hdr.Get("Retry-After"), storeT)
	}
	var r, tt int64
	item := hdr.Get("RateLimit")
	if _, err := sscanItem(item, name, &r, &tt); err != nil || r != 0 || tt < storeT-1 || tt > storeT+1 {
		t.Errorf("local refusal: RateLimit %q; want r=0 and t within 1s of the store's t=%d (store: %+v)", item, storeT, sr)
	}
	if got := hdr.Get("RateLimit-Remaining"); got != "0" {
		t.Errorf("local refusal: RateLimit-Remaining %q, want 0", got)
	}
	if sr.Remaining > 1 {
		t.Errorf("the store had %d tokens right after a local refusal", sr.Remaining)
	}
}

// sscanItem reads r and t from `"<name>";r=<r>;t=<t>`.
func sscanItem(item, name string, r, t *int64) (int, error) {
	prefix := `"` + name + `";r=`
	if len(item) < len(prefix) || item[:len(prefix)] != prefix {
		return 0, errors.New("not an item of " + name)
	}
	rest := item[len(prefix):]
	i := 0
	for i < len(rest) && rest[i] != ';' {
		i++
	}
	var err error
	if *r, err = strconv.ParseInt(rest[:i], 10, 64); err != nil {
		return 0, err
	}
	if len(rest) < i+3 || rest[i:i+3] != ";t=" {
		return 0, errors.New("no t")
	}
	*t, err = strconv.ParseInt(rest[i+3:], 10, 64)
	return 2, err
}

// floodWithAndWithout floods st without and with the deny cache, and
// checks that the cache keeps what is allowed and saves the store calls.
func floodWithAndWithout(t *testing.T, st store.Store) {
	plain := flood(t, st, "flood-plain")
	cached := flood(t, st, "flood-cached", middleware.WithDenyCache(1000))
	for _, r := range []struct {
		name string
		floodResult
	}{{"without the cache", plain}, {"with the cache", cached}} {
		if got, ideal := float64(r.allowed), r.ideal(); got < ideal-3-r.lost() || got > ideal+1 {
			t.Errorf("%s: %d allowed in %v; want %.1f (10 + 100/s), -3/+1, less %.1f lost in %v of stalls",
				r.name, r.allowed, r.elapsed, ideal, r.lost(), r.stalled)
		}
	}
	// The two floods may last a little differently (a slow store call
	// delays the last requests): compare what each allowed with its ideal.
	if d := (float64(cached.allowed) - cached.ideal()) - (float64(plain.allowed) - plain.ideal()); d < -4-cached.lost() || d > 4+plain.lost() {
		t.Errorf("allowed %d of %.1f with the cache, %d of %.1f without; want the same within 4",
			cached.allowed, cached.ideal(), plain.allowed, plain.ideal())
	}
	if plain.takes != 2000 || plain.local != 0 {
		t.Errorf("without the cache: %d store calls, %d local refusals; want 2000 and 0", plain.takes, plain.local)
	}
	// Every request the cache did not refuse reached the store: the
	// allowed ones, and the denials that (re)made the entry — at most one
	// per token that came back during the flood (the allowed probe drops
	// the entry, and the next request is denied by the store), plus the
	// first denial.
	storeDenials := cached.takes - int64(cached.allowed)
	if cached.local != int64(cached.denied)-storeDenials {
		t.Errorf("with the cache: %d local refusals; want denied - store denials = %d", cached.local, int64(cached.denied)-storeDenials)
	}
	if maxDenials := int64(cached.allowed-floodLimit.Burst) + 3; storeDenials > maxDenials {
		t.Errorf("with the cache: %d store calls for %d allowed: %d store denials, want at most one per token returned (%d)",
			cached.takes, cached.allowed, storeDenials, maxDenials)
	}
	t.Logf("without the cache: %d allowed, %d denied, %d store calls in %v", plain.allowed, plain.denied, plain.takes, plain.elapsed.Round(time.Millisecond))
	t.Logf("with the cache: %d allowed, %d denied (%d locally), %d store calls (%d denials) in %v: %.4f store calls per denied request, %.4f store denials per allowed",
		cached.allowed, cached.denied, cached.local, cached.takes, storeDenials, cached.elapsed.Round(time.Millisecond),
		float64(storeDenials)/float64(cached.denied), float64(storeDenials)/float64(cached.allowed))
}

func TestDenyCacheFloodMemory(t *testing.T) {
	t.Parallel()
	m := store.NewMemory()
	defer m.Close()
	floodWithAndWithout(t, m)
}

func TestDenyCacheFloodRedis(t *testing.T) {
	t.Parallel()
	floodWithAndWithout(t, store.NewRedis(redistest.Server(t).Client(t), store.WithKeyPrefix(t.Name()+":")))
}

// TestDenyCacheConcurrent floods a few keys from many goroutines at once,
// for the race detector, and checks that the limit holds and nothing is
// left running.
func TestDenyCacheConcurrent(t *testing.T) {
	leaktest.Check(t)
	m := store.NewMemory()
	defer m.Close()
	cs := &countingStore{Store: m}
	l := mustNew(t, cs, floodLimit, middleware.WithDenyCache(2),
		middleware.WithKeyFunc(func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }))
	h := l.Handler(okHandler)
	const clients, goroutines = 3, 8
	var allowed [clients]atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1500 {
				c := (g + i) % clients
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				r.Header.Set("X-Client", "c"+strconv.Itoa(c))
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				switch w.Code {
				case 200:
					allowed[c].Add(1)
				case 429:
				default:
					t.Errorf("status %d", w.Code)
					return
				}
				if i%50 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	limit := float64(floodLimit.Burst) + float64(floodLimit.Rate)*elapsed.Seconds()
	for c := range clients {
		if got := float64(allowed[c].Load()); got > limit+1 || got < 1 {
			t.Errorf("client %d: %v allowed in %v; want at most %.1f", c, got, elapsed, limit)
		}
	}
	hits := l.Stats().DenyCacheHits
	if hits == 0 || cs.n.Load()+hits != clients*4000 {
		t.Errorf("%d store calls, %d local refusals; want some local, and %d in all", cs.n.Load(), hits, clients*4000)
	}
	if n := middleware.DenyCacheLen(l); n > 2 {
		t.Errorf("%d entries, want at most 2", n)
	}
}
