package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// The edge cases of the penalty box, each found by a review and each
// failing before its fix. Their limiter is "pe", keyed by the default peer.

const peKey = "pe:ip:192.0.2.1"

// With WithDelay, the 429 that lands a block says when the store queues a
// request again (its tokens less MaxDelay), and so does the deny cache.
func TestPenaltyWithDelayRetryAfter(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
	lim := store.Limit{Rate: 1, Period: time.Second, Burst: 1}
	const delay = 300 * time.Millisecond // the last request waits it, on the real clock
	var got store.Result
	l := mustNew(t, m, lim, middleware.WithName("pe"), quiet, middleware.WithDelay(delay), middleware.WithDenyCache(100),
		middleware.WithDeniedHandler(func(w http.ResponseWriter, r *http.Request, res store.Result) {
			got = res
			w.WriteHeader(429)
		}),
		middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: time.Minute}))
	var mono time.Duration = time.Hour
	middleware.SetDenyCacheClock(l, func() time.Duration { return mono })
	h := l.Handler(okHandler)
	for range 2 { // empty the bucket
		if _, err := m.TakeDelayed(context.Background(), peKey, lim, 1, delay); err != nil {
			t.Fatal(err)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	ra, _ := strconv.Atoi(w.Header().Get("Retry-After"))
	t.Logf("blocking 429: code %d Retry-After %ds, result RetryAfter %v ResetAfter %v", w.Code, ra, got.RetryAfter, got.ResetAfter)
	// When would the store admit (queue) a request?
	admitAt := got.ResetAfter + time.Second - (time.Second + delay) // D + k - fit
	t.Logf("store would queue a request after %v; 429 said %v", admitAt, got.RetryAfter)
	step := admitAt + time.Millisecond
	now, mono = now.Add(step), mono+step
	res, _ := store.Inspect(context.Background(), m, peKey, lim, 1)
	t.Logf("at +%v: store bucket ResetAfter %v", step, res.ResetAfter)
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	t.Logf("at +%v: code %d, deny cache hits %d", step, w.Code, l.Stats().DenyCacheHits)
	if got.RetryAfter > admitAt+time.Millisecond {
		t.Errorf("blocking 429's RetryAfter %v, but the store queues requests after %v", got.RetryAfter, admitAt)
	}
	if w.Code == 429 {
		t.Errorf("deny cache refuses a request the store would queue")
	}
}

// A block no longer than MaxDelay is a block too: it is lengthened by
// MaxDelay, so that no request is queued into it and served.
func TestPenaltyShortBlockUnderDelay(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
	lim := store.Limit{Rate: 10, Period: time.Second, Burst: 1} // a token per 100 ms
	var served atomic.Int64
	l := mustNew(t, m, lim, middleware.WithName("pe"), quiet, middleware.WithDelay(500*time.Millisecond),
		middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: 200 * time.Millisecond,
			Failed: func(r *http.Request, status int) bool { return status == 401 }}))
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { served.Add(1); w.WriteHeader(401) }))
	for i := range 4 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		res, _ := store.Inspect(context.Background(), m, peKey, lim, 1)
		t.Logf("request %d: %d; bucket ResetAfter %v", i+1, w.Code, res.ResetAfter)
	}
	if n := served.Load(); n > 1 {
		t.Errorf("%d requests reached the handler; after the first blocked (200ms, clock frozen), want 1", n)
	}
}

// failing wraps a Memory, failing Take on demand (an outage).
type failing struct {
	*store.Memory
	fail atomic.Bool
}

func (f *failing) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	if f.fail.Load() {
		return store.Result{}, errors.New("down")
	}
	return f.Memory.Take(ctx, key, lim, cost)
}

// FailLocal's local share is blocked too: a store outage during a block
// does not let the client through.
func TestPenaltyBlocksTheLocalShare(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	fs := &failing{Memory: m}
	lim := store.Limit{Rate: 10, Period: time.Second, Burst: 2}
	h := mustNew(t, fs, lim, middleware.WithName("pe"), quiet, middleware.WithBreaker(0, 0),
		middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: time.Hour})).Handler(okHandler)
	codes := []int{}
	for range 3 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		codes = append(codes, w.Code)
	}
	res, _ := store.Inspect(context.Background(), m, peKey, lim, 1)
	t.Logf("codes %v, bucket RetryAfter %v", codes, res.RetryAfter)
	time.Sleep(300 * time.Millisecond)
	fs.fail.Store(true)
	served := 0
	for range 5 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		if w.Code == 200 {
			served++
		}
	}
	if served > 0 {
		t.Errorf("blocked for an hour, yet %d of 5 served during an outage (FailLocal)", served)
	}
}

// A block that the bucket cannot hold on top of the debt a strike finds
// (a whole bucket) is refused by New, rather than failing at every strike.
func TestPenaltyValidatesTheBlockWithItsDebt(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim := store.PerSecond(1)
	block := time.Duration(1<<50-1_000_000) * time.Microsecond
	if err := lim.ValidateBlock(block); err != nil {
		t.Fatal(err) // on an empty bucket, it fits
	}
	if _, err := middleware.New(m, lim, middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: block})); err == nil {
		t.Error("New accepted a block that no strike can land")
	}
}

// A request the limiter queued but that the server's deadline cannot wait
// for is refused, and is no strike: it is not the client's doing.
func TestPenaltyLateRefusalIsNoStrike(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim := store.Limit{Rate: 10, Period: time.Second, Burst: 1}
	h := mustNew(t, m, lim, middleware.WithName("pe"), quiet, middleware.WithDelay(time.Second),
		middleware.WithPenalty(middleware.Penalty{Strikes: 2, Within: time.Minute, Block: time.Hour})).Handler(okHandler)
	codes := []int{}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
		cancel()
		codes = append(codes, w.Code)
	}
	time.Sleep(200 * time.Millisecond)
	res, _ := store.Inspect(context.Background(), m, peKey, lim, 1)
	t.Logf("codes %v; 200ms later bucket RetryAfter %v", codes, res.RetryAfter)
	if res.RetryAfter > time.Minute {
		t.Errorf("blocked by refusals the server's deadline made, of requests the limiter admitted")
	}
}

// A long request admitted before the block and refunded during it gives no
// tokens back into the block.
func TestPenaltyRefundDuringBlock(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
	lim := store.Limit{Rate: 1, Period: time.Minute, Burst: 1}
	var h http.Handler
	codes := []int{}
	serve := func(path string) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		return w.Code
	}
	l := mustNew(t, m, lim, middleware.WithName("pe"), quiet,
		middleware.WithRefund(func(r *http.Request, status int) bool { return r.URL.Path == "/long" }),
		middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: 10 * time.Minute}))
	h = l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/long" { // a long download, refunded when done
			now = now.Add(61 * time.Second)
			codes = append(codes, serve("/a"), serve("/b")) // 200, then 429: blocked 10 min
			now = now.Add(59 * time.Second)
		}
	}))
	codes = append([]int{serve("/long")}, codes...)
	res, _ := store.Inspect(context.Background(), m, peKey, lim, 1)
	if res.RetryAfter < 9*time.Minute {
		t.Errorf("codes %v; 59 s into the 10-minute block, the long request's refund left RetryAfter %v", codes, res.RetryAfter)
	}
}

// A request admitted before the block that fails during it is no strike.
func TestPenaltyFailureDuringBlock(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := store.NewMemory(store.WithClock(func() time.Time { return now }), store.WithSweepInterval(0))
	lim := store.Limit{Rate: 100, Period: time.Minute, Burst: 100}
	var h http.Handler
	serve := func(path string) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		return w.Code
	}
	l := mustNew(t, m, lim, middleware.WithName("pe"), quiet,
		middleware.WithPenalty(middleware.Penalty{Strikes: 2, Within: time.Hour, Block: time.Minute,
			Failed: func(r *http.Request, status int) bool { return status == 401 }}))
	h = l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			serve("/f")
			serve("/f") // two failures: blocked
		}
		w.WriteHeader(401)
	}))
	serve("/slow") // fails during the block
	now = now.Add(5 * time.Minute)
	serve("/f") // one failure after the block
	if res, _ := store.Inspect(context.Background(), m, peKey, lim, 1); res.RetryAfter > 0 {
		t.Errorf("one failure after the block blocked again (a strike counted during it): %v", res.RetryAfter)
	}
}

// A user's request in flight when another of theirs lands a block, and then
// refunded, gives its token back to the global policy, which is nobody's to
// block, and not to the user's blocked bucket.
func TestPenaltyRefundDuringBlockKeepsOthersPolicies(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	perUser := store.Limit{Rate: 5, Period: time.Hour, Burst: 5}
	global := store.Limit{Rate: 100, Period: time.Hour, Burst: 100}
	release, entered := make(chan struct{}), make(chan struct{})
	mw, err := middleware.NewMulti(m, []middleware.Policy{
		{Name: "per-user", Limit: perUser},
		{Name: "global", Limit: global, Key: mustKey(keyfuncs.Static("all"))},
	}, middleware.WithKeyFunc(userKey), quiet,
		middleware.WithRefund(func(r *http.Request, status int) bool { return status == 500 }),
		middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: time.Hour,
			Failed: func(r *http.Request, status int) bool { return status == 401 }}))
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			close(entered)
			<-release
			w.WriteHeader(500)
			return
		}
		w.WriteHeader(401)
	}))
	done := make(chan struct{})
	go func() { defer close(done); serveUser(h, "a", "X-Slow", "1") }()
	<-entered
	if c := serveUser(h, "a").Code; c != 401 { // the strike that blocks
		t.Fatalf("striking request: %d", c)
	}
	close(release)
	<-done
	if res, _ := store.Inspect(context.Background(), m, "global:{all}", global, 1); res.Remaining != 99 {
		t.Errorf("global bucket: %d remaining, want 99 (the 401 kept its token, the 500's came back)", res.Remaining)
	}
	if res, _ := store.Inspect(context.Background(), m, "per-user:{user:a}", perUser, 1); res.RetryAfter < time.Hour {
		t.Errorf("the user's bucket after the refund: %+v, want still blocked", res)
	}
}

// hanging is a Memory whose Takes hang until their context ends, once told.
type hanging struct {
	*store.Memory
	fail atomic.Bool
}

func (f *hanging) Take(ctx context.Context, key string, lim store.Limit, cost int) (store.Result, error) {
	if f.fail.Load() {
		<-ctx.Done()
		return store.Result{}, ctx.Err()
	}
	return f.Memory.Take(ctx, key, lim, cost)
}

// With the breaker open, a refunded request does not read its bucket for a
// block first: no waiting on a store known to fail.
func TestPenaltyReadsNoBlockPastAnOpenBreaker(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	fs := &hanging{Memory: m}
	var h http.Handler
	l := mustNew(t, fs, store.Limit{Rate: 10, Period: time.Second, Burst: 10}, middleware.WithName("pe"), quiet,
		middleware.WithBreaker(1, time.Minute), middleware.WithTimeout(300*time.Millisecond), middleware.WithFailurePolicy(middleware.FailOpen),
		middleware.WithRefund(func(r *http.Request, status int) bool { return status == 500 }),
		middleware.WithPenalty(middleware.Penalty{Strikes: 1, Within: time.Minute, Block: time.Hour}))
	var returned time.Time
	h = l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Inner") != "" {
			return
		}
		fs.fail.Store(true)
		serveUser(h, "x", "X-Inner", "1") // times out: the breaker opens
		if l.BreakerState() != middleware.BreakerOpen {
			t.Errorf("breaker %v, want open", l.BreakerState())
		}
		w.WriteHeader(500)
		returned = time.Now()
	}))
	serveUser(h, "x")
	if d := time.Since(returned); d > 150*time.Millisecond {
		t.Errorf("%v in the middleware after the handler returned, with the breaker open; want no store call", d)
	}
}
