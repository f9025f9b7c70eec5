package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-go/tollgate/internal/redistest"
	"github.com/tollgate-go/tollgate/keyfuncs"
	"github.com/tollgate-go/tollgate/middleware"
	"github.com/tollgate-go/tollgate/store"
)

// awayFromMidnight waits out the last seconds of a UTC day, so that a test
// of a daily quota does not cross into the next.
func awayFromMidnight() {
	if until := time.Until(time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)); until < 10*time.Second {
		time.Sleep(until + 100*time.Millisecond)
	}
}

// secondsNear reports whether the header value v is d in whole seconds,
// rounded up, or a second less (the clock ticks between the two readings).
func secondsNear(v string, d time.Duration) bool {
	n, err := strconv.ParseInt(v, 10, 64)
	want := int64((d + time.Second - 1) / time.Second)
	return err == nil && (n == want || n == want-1)
}

// A token bucket and a daily quota on each user, through the one engine on
// every store: the quota's headers state it (q/w of the day, t until UTC
// midnight), its 429 says to come back then, and a denial by either takes
// nothing from the other.
func TestWindowQuotaThroughMiddleware(t *testing.T) {
	awayFromMidnight()
	multiStores(t, func(t *testing.T, s store.Store) {
		daily := store.PerDayIn(5, nil)
		m, err := middleware.NewMulti(s, []middleware.Policy{
			{Name: "rate", Limit: store.Limit{Rate: 1, Period: time.Hour, Burst: 7}},
			{Name: "daily", Limit: daily},
		}, middleware.WithKeyFunc(userKey), patient)
		if err != nil {
			t.Fatal(err)
		}
		h := m.Handler(okHandlerFunc)
		midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
		for i := range 5 {
			w := serveUser(h, "ann")
			if w.Code != 200 {
				t.Fatalf("request %d: status %d", i, w.Code)
			}
			if i > 0 {
				continue
			}
			if p := w.Header().Get("RateLimit-Policy"); !strings.Contains(p, `"daily";q=5;w=86400`) {
				t.Errorf("RateLimit-Policy = %q; want the daily quota's q=5;w=86400", p)
			}
			rl := w.Header().Get("RateLimit")
			_, item, _ := strings.Cut(rl, `"daily";r=4;t=`)
			if !secondsNear(item, time.Until(midnight)) {
				t.Errorf("RateLimit = %q; want the daily quota's r=4 and t until midnight, %v", rl, time.Until(midnight))
			}
		}
		w := serveUser(h, "ann")
		if w.Code != 429 || !secondsNear(w.Header().Get("Retry-After"), time.Until(midnight)) {
			t.Errorf("past the quota: %d, Retry-After %q; want 429 until midnight (%v)", w.Code, w.Header().Get("Retry-After"), time.Until(midnight))
		}
		ctx := context.Background()
		if r, err := s.Take(ctx, "rate:{user:ann}", store.Limit{Rate: 1, Period: time.Hour, Burst: 7}, 0); err != nil || r.Remaining != 2 {
			t.Errorf("bucket after the quota's denial = %+v, %v; want 2 left: nothing taken", r, err)
		}
		// The bucket runs out first: the quota keeps what it had.
		m2, err := middleware.NewMulti(s, []middleware.Policy{
			{Name: "tight", Limit: store.Limit{Rate: 1, Period: time.Hour, Burst: 2}},
			{Name: "daily", Limit: daily},
		}, middleware.WithKeyFunc(userKey), patient)
		if err != nil {
			t.Fatal(err)
		}
		h2 := m2.Handler(okHandlerFunc)
		codes := []int{serveUser(h2, "cy").Code, serveUser(h2, "cy").Code, serveUser(h2, "cy").Code}
		if codes[0] != 200 || codes[1] != 200 || codes[2] != 429 {
			t.Errorf("statuses %v; want 200, 200, 429 (the bucket of 2)", codes)
		}
		if r, err := s.Take(ctx, "daily:{user:cy}", daily, 0); err != nil || r.Remaining != 3 {
			t.Errorf("quota after the bucket's denial = %+v, %v; want 3 left: nothing taken", r, err)
		}
	})
}

// A sliding window and a monthly quota alone, and the options that have no
// meaning for a quota refused by New.
func TestWindowQuotaLimiter(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	lim, err := middleware.New(m, store.SlidingWindow(3, time.Minute), middleware.WithKeyFunc(userKey))
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(okHandlerFunc)
	for i := range 3 {
		if w := serveUser(h, "dee"); w.Code != 200 || !strings.HasSuffix(w.Header().Get("RateLimit-Policy"), ";q=3;w=60") {
			t.Fatalf("request %d: %d, RateLimit-Policy %q; want 200 with q=3;w=60", i, w.Code, w.Header().Get("RateLimit-Policy"))
		}
	}
	if w := serveUser(h, "dee"); w.Code != 429 || w.Header().Get("Retry-After") == "" || w.Header().Get("Retry-After") == "0" {
		t.Errorf("fourth request: %d, Retry-After %q; want 429 and a wait", w.Code, w.Header().Get("Retry-After"))
	}
	monthly, err := middleware.New(m, store.PerMonthIn(100, nil), middleware.WithKeyFunc(userKey))
	if err != nil {
		t.Fatal(err)
	}
	start, end := store.PerMonthIn(100, nil).WindowAt(time.Now())
	w := serveUser(monthly.Handler(okHandlerFunc), "eve")
	if want := ";q=100;w=" + strconv.Itoa(int(end.Sub(start)/time.Second)); w.Code != 200 || !strings.HasSuffix(w.Header().Get("RateLimit-Policy"), want) {
		t.Errorf("monthly: %d, RateLimit-Policy %q; want 200 and %q: this month's length", w.Code, w.Header().Get("RateLimit-Policy"), want)
	}
	if a, b := middleware.DefaultName(store.FixedWindow(5, time.Hour)), middleware.DefaultName(store.PerHour(5)); a == b {
		t.Errorf("a quota and a bucket of one rate share the default name %q", a)
	}
	for name, opt := range map[string]middleware.Option{
		"WithDelay":   middleware.WithDelay(time.Second),
		"WithPenalty": middleware.WithPenalty(middleware.Penalty{Strikes: 5, Within: time.Minute, Block: 15 * time.Minute}),
	} {
		want := name + `: policy "day" is a window quota`
		if _, err := middleware.New(m, store.PerDayIn(5, nil), opt, middleware.WithName("day")); err == nil || !strings.Contains(err.Error(), "token bucket") || !strings.Contains(err.Error(), want) {
			t.Errorf("New with a daily quota and %s: %v; want an error saying %q, naming token buckets", name, err, want)
		}
		if _, err := middleware.NewMulti(m, []middleware.Policy{{Name: "s", Limit: store.PerSecond(10)}, {Name: "day", Limit: store.PerDayIn(5, nil)}}, opt); err == nil {
			t.Errorf("NewMulti with a daily quota and %s: no error", name)
		}
	}
	// A deny cache serves a plan's token bucket and leaves a quota's alone.
	tiers := middleware.Tiers{Of: func(*http.Request) string { return "pro" }, Default: "free", Plans: map[string][]middleware.Policy{
		"free": {{Name: "day", Limit: store.PerDayIn(1000, nil)}}, "pro": {{Name: "s", Limit: store.PerSecond(2)}}}}
	if _, err := middleware.NewTiered(m, tiers, middleware.WithDenyCache(100)); err != nil {
		t.Errorf("NewTiered with a quota plan, a bucket plan and WithDenyCache: %v", err)
	}
}

// With Redis hung, FailLocal holds a daily quota to its share on each of 4
// instances, in the same day, and its headers say so.
func TestFailLocalQuotaShare(t *testing.T) {
	awayFromMidnight()
	addr := redistest.HangingAddr(t)
	daily := store.PerDayIn(40, nil)
	for instance := range 4 {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		l, err := middleware.New(store.NewRedis(rdb), daily, middleware.WithName("daily"),
			middleware.WithFailurePolicy(middleware.FailLocalShare(4)),
			middleware.WithTimeout(20*time.Millisecond), quiet,
			middleware.WithKeyFunc(mustKey(keyfuncs.Static("everyone"))))
		if err != nil {
			t.Fatal(err)
		}
		h := l.Handler(okHandlerFunc)
		allowed := 0
		var last *httptest.ResponseRecorder
		for range 20 {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
			if w.Code == 200 {
				allowed++
			} else {
				last = w
			}
		}
		if allowed != 10 || last == nil {
			t.Fatalf("instance %d: allowed %d of 20; want 10 (40/4)", instance, allowed)
		}
		if got := last.Header().Get("RateLimit-Policy"); got != `"daily";q=10;w=86400` {
			t.Errorf("RateLimit-Policy during FailLocal %q; want the local share of the day", got)
		}
		midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
		if !secondsNear(last.Header().Get("Retry-After"), time.Until(midnight)) {
			t.Errorf("Retry-After %q; want until midnight, %v", last.Header().Get("Retry-After"), time.Until(midnight))
		}
	}
}

// A refund of a request served across its window's end does not reach into
// the next window: two others filled it, and a third is refused.
func TestWindowRefundStaysInItsWindow(t *testing.T) {
	m := store.NewMemory()
	defer m.Close()
	var second time.Time // the start of the next whole second, the next window
	lim, err := middleware.New(m, store.FixedWindow(2, time.Second), middleware.WithKeyFunc(userKey),
		middleware.WithRefund(func(_ *http.Request, status int) bool { return status >= 500 }))
	if err != nil {
		t.Fatal(err)
	}
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			time.Sleep(time.Until(second.Add(300 * time.Millisecond)))
			w.WriteHeader(http.StatusInternalServerError) // to be refunded
		}
	}))
	// attempt reports whether the steps kept to their window (a loaded
	// machine may not), and judges the third request if they did.
	attempt := func(user string) bool {
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 50*time.Millisecond)))
		second = time.Now().Truncate(time.Second).Add(time.Second)
		done := make(chan int)
		go func() { done <- serveUser(h, user, "X-Slow", "1").Code }()
		time.Sleep(time.Until(second.Add(100 * time.Millisecond)))
		for i := range 2 {
			if w := serveUser(h, user); w.Code != 200 {
				t.Fatalf("request %d of the next window: %d", i, w.Code)
			}
		}
		if code := <-done; code != 500 {
			t.Fatalf("the slow request: %d", code)
		}
		if time.Since(second) > 900*time.Millisecond {
			return false
		}
		if w := serveUser(h, user); w.Code != 429 {
			t.Errorf("third request of the window after a refund from the one before: %d; want 429", w.Code)
		}
		return time.Since(second) < time.Second
	}
	for i := 0; !attempt("fay" + strconv.Itoa(i)); i++ {
		if i == 4 {
			t.Fatal("5 attempts did not keep to their windows")
		}
	}
}
